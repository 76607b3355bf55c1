"""Adapters that expose optima's tasks to other frameworks.

Each adapter is its own module and imports its framework there, so importing ``optima_env`` (or
this package) never needs them: :mod:`optima_env.integrations.verifiers` needs the
``optima[verifiers]`` extra.
"""
