"""Hook specifications: the seams where plugins plug into optima.

Hooks are grouped by lifecycle. Every plugin, the built-in tasks and trainers included, implements
them with the ``optima_env.hookimpl`` marker and is found through the ``optima`` entry-point group
(see :func:`optima_env.registry.get_plugin_manager`).

Registration
    ``optima_register_tasks``, ``optima_register_trainers``, ``optima_register_readability_scorers``
Configuration
    ``optima_configure``
Rollout (episode events)
    ``optima_episode_start``, ``optima_episode_end``
Training (iteration events and data selection)
    ``optima_iteration_start``, ``optima_iteration_end``, ``optima_select_training_data``
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from optima_env.registry import ReadabilitySpec, TaskSpec, TrainerSpec
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
    "optima_iteration_end",
    "optima_iteration_start",
    "optima_register_readability_scorers",
    "optima_register_tasks",
    "optima_register_trainers",
    "optima_select_training_data",
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
def optima_register_readability_scorers() -> list[ReadabilitySpec]:
    """Return readability scorers (frozen-LM loss scorers) this plugin provides, by name."""


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
    """Called once per finished episode with its full record (reward breakdown when computed).

    Fired by the env when an episode ends. This is how trainers and loggers consume episodes
    without reaching into env internals. The return value is ignored.
    """


# ---------------------------------------------------------------------------------------------
# Training: fired by the trainer loop.
# ---------------------------------------------------------------------------------------------


@hookspec
def optima_iteration_start(iteration: int, config: Mapping[str, Any]) -> None:
    """Called by the iterative trainer loop before generating the data of ``iteration``."""


@hookspec
def optima_iteration_end(iteration: int, metrics: Mapping[str, float]) -> None:
    """Called by the iterative trainer loop after ``iteration`` has trained, with its metrics."""


@hookspec(firstresult=True)
def optima_select_training_data(
    episodes: Sequence[Episode], trainer: str, config: Mapping[str, Any]
) -> list[Episode] | None:
    """Choose the training episodes of one iteration.

    Stops at the first non-``None`` result; the built-in selection (spec §5) is registered
    ``trylast``, so a plugin returning a list overrides it and one returning ``None`` defers.
    """
