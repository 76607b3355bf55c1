"""Hook specifications: the seams where plugins plug into optima.

Hooks are grouped by lifecycle. Every plugin, the built-in tasks and trainers included, implements
them with the ``optima_env.hookimpl`` marker and is found through the ``optima`` entry-point group
(see :func:`optima_env.registry.get_plugin_manager`).

Registration
    ``optima_register_tasks``, ``optima_register_trainers``, ``optima_register_recipes``,
    ``optima_register_readability_scorers``
Configuration
    ``optima_configure``
Rollout (episode events)
    ``optima_episode_start``, ``optima_episode_end``

The training events (``optima_iteration_start``, ``optima_iteration_end``,
``optima_select_training_data``, ``optima_episode_scored``, ``optima_generation_end``) are typed
hookspecs of the trainers package (:mod:`optima_trainers.hookspecs`), which its host adds to the
run's plugin manager; they use the same ``hookimpl`` marker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from optima_env.specs import ReadabilitySpec, Recipe, TaskSpec, TrainerSpec
    from optima_env.types import Episode

PROJECT_NAME = "optima"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

__all__ = [
    "PROJECT_NAME",
    "hookimpl",
    "hookspec",
    "optima_configure",
    "optima_episode_end",
    "optima_episode_start",
    "optima_register_readability_scorers",
    "optima_register_recipes",
    "optima_register_tasks",
    "optima_register_trainers",
]

# ---------------------------------------------------------------------------------------------
# Registration: called once per plugin manager; each plugin returns a list, the host flattens.
# ---------------------------------------------------------------------------------------------


@hookspec
def optima_register_tasks() -> list[TaskSpec]:
    """Return the tasks this plugin provides.

    Called by :func:`optima_env.registry.task_specs` once per plugin manager. Each plugin returns a
    list of :class:`~optima_env.registry.TaskSpec`; the lists are flattened. Two specs with the same
    id raise :class:`~optima_env.errors.PluginError` naming both plugins.
    """


@hookspec
def optima_register_trainers() -> list[TrainerSpec]:
    """Return the trainer backends this plugin provides (``isft``, ``idpo``, ... for built-ins).

    Called by :func:`optima_env.registry.trainer_specs`; lists are flattened; duplicate names raise
    :class:`~optima_env.errors.PluginError`.
    """


@hookspec
def optima_register_recipes() -> list[Recipe]:
    """Return the per-task trainer recipes this plugin provides (:class:`~optima_env.specs.Recipe`).

    A task plugin registers the recipes it was tuned with for the trainers it knows (the built-in
    tasks: the paper's for ``isft``, ``idpo``, ``isft-dpo``); a trainer plugin registers its own for
    the tasks it knows. Collected by :func:`optima_env.registry.recipe_specs`; the same ``(task,
    trainer, preset)`` from two plugins raises :class:`~optima_env.errors.PluginError` naming both.
    """


@hookspec
def optima_register_readability_scorers() -> list[ReadabilitySpec]:
    """Return readability scorers (frozen-LM loss scorers) this plugin provides, by name.

    Collected by :func:`optima_env.registry.readability_specs`; the trainer loads the one named by
    its ``readability_scorer`` setting (built in: ``transformers``). A plugin adds a scorer (a
    remote LM-loss service, another engine) under a new name; duplicate names raise
    :class:`~optima_env.errors.PluginError`.
    """


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@hookspec(historic=True)
def optima_configure(config: Mapping[str, Any]) -> None:
    """Receive the resolved run configuration before a run starts.

    Historic: a plugin registered later still receives the call. The return value is ignored.
    """


# ---------------------------------------------------------------------------------------------
# Rollout: fired by the conversation env, whoever drives it.
# ---------------------------------------------------------------------------------------------


@hookspec
def optima_episode_start(task_id: str, sample_id: str, seed: int | None) -> None:
    """Called by :class:`~optima_env.conversation_env.ConversationEnv` after each ``reset``."""


@hookspec
def optima_episode_end(episode: Episode) -> None:
    """Called by the env once per finished episode with its full record.

    Its ``reward`` is the env's own per-episode reward (a fixed token normalizer), or ``None``
    when the env was built with ``scoring=False``, as the trainers build it: their rewards depend
    on the whole instance group, so they score afterwards and fire ``optima_episode_scored``.
    The return value is ignored.
    """
