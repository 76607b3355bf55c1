"""Adapters that run optima tasks inside other RL libraries (TRL; verifiers when installed)."""
