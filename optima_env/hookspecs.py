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
Training (fired by the host loop, :class:`optima_trainers.loop.IterativeTrainer`)
    ``optima_iteration_start``, ``optima_iteration_end``, ``optima_select_training_data``,
    ``optima_episode_scored``, ``optima_generation_end``
Trainer backends (answered by the run's backend, which the host registers for the run)
    ``optima_trainer_stages``, ``optima_train_stage``

Payload types of the training hooks live in :mod:`optima_trainers.stages` (``Stage``,
``StageData``, ``StageOutcome``); they are annotated ``Any`` here because ``optima_env`` does not
import ``optima_trainers``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from optima_env.specs import ReadabilitySpec, TaskSpec, TrainerSpec
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
    "optima_episode_scored",
    "optima_episode_start",
    "optima_generation_end",
    "optima_iteration_end",
    "optima_iteration_start",
    "optima_register_readability_scorers",
    "optima_register_tasks",
    "optima_register_trainers",
    "optima_select_training_data",
    "optima_train_stage",
    "optima_trainer_stages",
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


@hookspec
def optima_episode_scored(episode: Episode, stage: Any) -> None:
    """Called by the trainer loop once per scored episode, with the reward that ranks it.

    ``episode.reward`` is the run's reward (its ``RewardConfig``, the group or tree normalizer and
    the frozen model's readability term): exactly what selection or the tree search used.
    ``stage`` is the :class:`optima_trainers.stages.Stage`. Fired when the episode is scored, not
    again when a resumed run reads the scores back. The return value is ignored.
    """


@hookspec
def optima_generation_end(stage: Any, data: Any) -> None:
    """Called by the trainer loop when a stage's data is ready, before the stage trains.

    ``data`` is an :class:`optima_trainers.stages.StageData`: every scored episode, the selected
    ones (sampled stages) and the preference pairs (tree stages), read back from the stage folder.
    Fired on every process that trains, and again when a resumed run trains a stage generated
    before the interruption, so a backend can keep its state in memory. Return value ignored.
    """


# ---------------------------------------------------------------------------------------------
# Trainer backends: answered by the run's backend only (the host registers it for the run).
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def optima_trainer_stages(config: Any) -> list[Any] | None:
    """Return the stages of a run (a list of :class:`optima_trainers.stages.Stage`), in order.

    ``config`` is the run's :class:`optima_trainers.config.TrainConfig`. Stops at the first
    non-``None`` result.
    """


@hookspec(firstresult=True)
def optima_train_stage(stage: Any, start_model: str, output_dir: Any) -> Any:
    """Train one stage from ``start_model`` into ``output_dir`` on the data delivered by
    ``optima_generation_end``; return an :class:`optima_trainers.stages.StageOutcome`.

    ``output_dir`` must appear complete or not at all (:func:`optima_trainers.checkpoint.atomic_checkpoint`).
    The host skips the call when a complete checkpoint is already there (a resumed run). Stops at
    the first non-``None`` result; ``None`` from every plugin is an error.
    """
