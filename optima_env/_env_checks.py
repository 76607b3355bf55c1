"""Input checks of :class:`~optima_env.conversation_env.ConversationEnv` (private).

Seeds, reset options (and the instance they draw), actions, the order of calls, and what the
task's scorer and the readability scorer return: each check raises an
:class:`~optima_env.errors.OptimaError` subclass saying what was expected, what was got and what
to do.
"""

from __future__ import annotations

import logging
import random
import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from optima_env.errors import EnvNotResetError, EpisodeOverError, TaskContractError
from optima_env.spaces import ACTION_MAX_LENGTH
from optima_env.task import Task
from optima_env.types import Episode, TaskSample

__all__ = [
    "RESET_OPTIONS",
    "check_action",
    "check_seed",
    "checked_score",
    "draw_instance",
    "episode_over",
    "not_reset",
    "readability_loss",
]

logger = logging.getLogger("optima_env.conversation_env")

RESET_OPTIONS = frozenset({"index", "sample", "format_index", "prefix"})

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60


def check_seed(seed: Any) -> int | None:
    """``seed`` as a plain ``int`` (numpy integers converted), or ``None``.

    >>> check_seed(np.int64(3)), check_seed(None)
    (3, None)
    """
    if seed is None:
        return None
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        return int(seed)
    raise TaskContractError(
        f"reset(seed=...) expects an int or None (numpy integers are converted), got "
        f"{type(seed).__name__} {_short.repr(seed)}; pass an integer such as seed=0, or None for a "
        "random episode"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def draw_instance(
    task: Task, split: str, options: Mapping[str, Any], *, rng: random.Random, diverse_formats: bool
) -> tuple[TaskSample, int | None]:
    """The instance and pool format an episode plays, from the reset options or drawn with ``rng``."""
    unknown = set(options) - RESET_OPTIONS
    if unknown:  # PettingZoo's api_test passes arbitrary options: warn, do not fail
        logger.warning(
            "ignoring unknown reset options %s; expected one of %s", sorted(unknown), sorted(RESET_OPTIONS)
        )
    if "sample" in options:
        sample = options["sample"]
        if not isinstance(sample, TaskSample):
            raise TaskContractError(f"options['sample'] must be a TaskSample, got {type(sample).__name__}")
    else:
        samples = task.samples(split)
        if len(samples) == 0:
            raise TaskContractError(f"task {task.id!r} split {split!r} has no instances")
        index = options.get("index", rng.randrange(len(samples)))
        if not _is_int(index) or not 0 <= index < len(samples):
            raise TaskContractError(f"options['index'] must be an int in [0, {len(samples)}), got {index!r}")
        sample = samples[index]
    if "format_index" in options:
        format_index = options["format_index"]
    elif diverse_formats:
        format_index = rng.randrange(task.num_formats)
    else:
        format_index = None
    if format_index is not None and not (_is_int(format_index) and 0 <= format_index < task.num_formats):
        raise TaskContractError(
            f"format_index must be None or an int in [0, {task.num_formats}), got {format_index!r}"
        )
    return sample, format_index


def check_action(agent: str, action: Any) -> str:
    """``action`` if it is an utterance the env accepts: a ``str`` of at most ACTION_MAX_LENGTH."""
    if not isinstance(action, str):
        raise TaskContractError(
            f"{agent}'s action must be a str (the utterance), got {type(action).__name__}"
        )
    if len(action) > ACTION_MAX_LENGTH:
        raise TaskContractError(
            f"{agent}'s action has {len(action):,} characters; an action holds at most "
            f"{ACTION_MAX_LENGTH:,} (optima_env.spaces.ACTION_MAX_LENGTH); cap the reply's length "
            "(e.g. SamplingParams.max_new_tokens) or truncate it before step()"
        )
    return action


def not_reset(method: str) -> EnvNotResetError:
    """The error of a call that needs an episode, made before the first ``reset()``."""
    return EnvNotResetError(
        f"{method}() was called before reset(); call env.reset(seed=...) first to start an episode"
    )


def episode_over(agent: str, action: Any, episode: Episode | None, turns: int) -> EpisodeOverError:
    """The error of a non-``None`` action given to an agent whose episode is over."""
    how = f"ended ({episode.end_reason}) after {turns} turns" if episode is not None else "is over"
    return EpisodeOverError(
        f"the episode {how}, but {agent} was given the action {_short.repr(action)}; PettingZoo "
        "expects step(None) for finished agents (env.step(None if terminated or truncated else "
        "reply)), or call reset() to start a new episode"
    )


def checked_score(task: Task, answer: str | None, sample: TaskSample) -> float:
    """The task's score of ``answer``, which must lie in [0, 1]."""
    score = float(task.score(answer, sample))
    if not 0.0 <= score <= 1.0:
        raise TaskContractError(f"task {task.id!r} scored {score!r}; scores must lie in [0, 1]")
    return score


def readability_loss(
    readability: Callable[[Sequence[str]], Sequence[float]] | None, texts: Sequence[str]
) -> float | None:
    """The max over turns of the readability scorer's per-turn losses (``None`` without a scorer)."""
    from optima_env.readability import max_turn_loss, score_turns

    if readability is None or not texts:
        return None
    return max_turn_loss(score_turns(readability, texts))
