"""The training events: typed hookspecs that the host loop fires and observers implement.

The host (:class:`optima_trainers.host.loop.IterativeTrainer`) adds these specs to the run's plugin
manager (:func:`add_trainer_hookspecs`) and fires them; observers (the metrics tracker, a user's
plugin, a backend that wants to see episodes as they are scored) implement them with the same
``optima_env.hookimpl`` marker as every other hook. A backend is not reached through hooks: the host
calls its methods (:class:`optima_trainers.backends.contract.TrainerBackend`).

    ``optima_iteration_start``, ``optima_iteration_end``     around each stage
    ``optima_episode_scored``                                  each episode, with the run's reward
    ``optima_select_training_data``                            a sampled stage's training episodes
    ``optima_generation_end``                                  a stage's data, before it trains
    ``optima_deliver_weights``                                 a model onto the generation servers
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pluggy

from optima_env.hookspecs import hookspec
from optima_env.types import Episode
from optima_trainers.run.stages import Stage, StageData

__all__ = [
    "add_trainer_hookspecs",
    "optima_deliver_weights",
    "optima_episode_scored",
    "optima_generation_end",
    "optima_iteration_end",
    "optima_iteration_start",
    "optima_select_training_data",
]


def add_trainer_hookspecs(pm: pluggy.PluginManager) -> pluggy.PluginManager:
    """Add these specs to ``pm`` (once; a plugin registered before still gets its calls)."""
    caller = getattr(pm.hook, "optima_iteration_start", None)
    if caller is None or caller.spec is None:
        pm.add_hookspecs(sys.modules[__name__])
    return pm


@hookspec
def optima_iteration_start(iteration: int, config: Mapping[str, Any]) -> None:
    """Called by the host loop before generating the data of stage number ``iteration``, with the
    run's configuration as a dict."""


@hookspec
def optima_iteration_end(iteration: int, metrics: Mapping[str, float]) -> None:
    """Called by the host loop after stage number ``iteration`` has trained, with its metrics."""


@hookspec(firstresult=True)
def optima_select_training_data(
    episodes: Sequence[Episode], trainer: str, config: Mapping[str, Any]
) -> list[Episode] | None:
    """Choose the training episodes of one sampled stage.

    Stops at the first non-``None`` result; the built-in selection (spec §5) is registered
    ``trylast``, so a plugin returning a list overrides it and one returning ``None`` defers.
    """


@hookspec
def optima_episode_scored(episode: Episode, stage: Stage) -> None:
    """Called once per scored episode, with the reward that ranks it.

    ``episode.reward`` is the run's reward (its ``RewardConfig``, the group or tree normalizer and
    the frozen model's readability term): exactly what selection or the tree search used. Fired
    when the episode is scored (by the host, or by an online backend for the conversations it
    plays), not again when a resumed run reads the scores back. The return value is ignored.
    """


@hookspec
def optima_generation_end(stage: Stage, data: StageData) -> None:
    """Called by the host when a stage's data is ready, before the stage trains.

    ``data`` holds every scored episode, the selected ones (sampled stages) and the preference pairs
    (tree stages), read back from the stage folder; the host passes the same record to the
    backend's :meth:`~optima_trainers.backends.contract.TrainerBackend.train`. Fired on every process that
    trains, and again when a resumed run trains a stage generated before the interruption. The
    return value is ignored.
    """


@hookspec(firstresult=True)
def optima_deliver_weights(checkpoint: str, base_urls: Sequence[str]) -> str | None:
    """Put the model folder ``checkpoint`` on the OpenAI-compatible servers at ``base_urls``
    and return the model name to request from them (``None``: this plugin does not deliver it).

    Called with ``generation.backend="openai"`` and ``generation.server_weights="hook"``
    (:mod:`optima_trainers.generation.engines`) before each stage generates, with the model that stage
    generates with (the starting model at the first stage, then each trained checkpoint: a full
    merged model folder). vLLM cannot swap a running server's full weights, so a plugin restarts
    its servers on the new folder (or uses its own weight-update endpoint) and returns once they
    answer. Stops at the first non-``None`` result; when every plugin returns ``None`` the run
    stops with an error saying what to register.
    """
