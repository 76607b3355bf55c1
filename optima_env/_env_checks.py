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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from optima_env.errors import EnvNotResetError, EpisodeOverError, TaskContractError
from optima_env.spaces import ACTION_MAX_LENGTH
from optima_env.task import Task
from optima_env.types import AgentView, Episode, TaskSample, Turn

__all__ = [
    "RESET_OPTIONS",
    "check_action",
    "check_env_options",
    "check_seed",
    "draw_instance",
    "episode_over",
    "episode_record",
    "not_reset",
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


def check_env_options(
    task: Task,
    *,
    max_turns: Any,
    turn_token_cap: Any,
    message_format: Any,
    render_mode: Any,
    render_modes: Sequence[str],
    scoring: Any,
    diverse_formats: Any,
) -> None:
    """The env constructor's option checks (each failure says what was expected)."""
    if not isinstance(max_turns, int) or max_turns < 1:
        raise TaskContractError(f"max_turns must be a positive int, got {max_turns!r}")
    if not isinstance(turn_token_cap, int) or turn_token_cap < 1:
        raise TaskContractError(f"turn_token_cap must be a positive int, got {turn_token_cap!r}")
    if message_format not in ("code", "alternating"):
        raise TaskContractError(f"message_format must be 'code' or 'alternating', got {message_format!r}")
    if render_mode not in (None, *render_modes):
        raise TaskContractError(f"render_mode must be None, 'human' or 'ansi', got {render_mode!r}")
    if not isinstance(scoring, bool):
        raise TaskContractError(f"scoring must be True or False, got {scoring!r}")
    if diverse_formats and task.num_formats == 0:
        raise TaskContractError(
            f"task {task.id!r} has no format-diverse prompt pool; pass diverse_formats=False"
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


# size: the Episode record's fields, passed by name from the env's state (a record builder)
def episode_record(
    task: Task,
    sample: TaskSample,
    *,
    seed: int | None,
    agents: Sequence[str],
    turns: Sequence[Turn],
    views: Mapping[str, AgentView],
    final_answer: str | None,
    task_score: float,
    end_reason: str,
    format_index: int | None,
    lm_loss: float | None,
    scorer: str,
) -> Episode:
    """The record of a finished episode (unscored; ``metadata["scorer"]`` names the task scorer)."""
    terminated = end_reason == "agreement"
    return Episode(
        task_id=task.id,
        sample_id=sample.id,
        seed=seed,
        agents=tuple(agents),
        turns=tuple(turns),
        final_answer=final_answer,
        gold=tuple(sample.answers),
        task_score=task_score,
        terminated=terminated,
        truncated=not terminated,
        end_reason=end_reason,
        num_tokens=sum(t.num_tokens for t in turns),
        system_prompts={a: v.system_prompt for a, v in views.items()},
        base_system_prompts={a: v.base_system_prompt for a, v in views.items()},
        format_index=format_index,
        lm_loss=lm_loss,
        metadata={"scorer": scorer},
    )


def check_prompt_budget(max_prompt_tokens: int | None, tokenizer: Any) -> int | None:
    """``max_prompt_tokens`` of the env (the model's context minus the turn cap), checked: a
    positive int, and a tokenizer with a chat template to count the prompts with."""
    if max_prompt_tokens is None:
        return None
    if isinstance(max_prompt_tokens, bool) or not isinstance(max_prompt_tokens, int) or max_prompt_tokens < 1:
        raise TaskContractError(f"max_prompt_tokens must be None or an int >= 1, got {max_prompt_tokens!r}")
    if tokenizer is None or not callable(getattr(tokenizer, "apply_chat_template", None)):
        raise TaskContractError(
            "max_prompt_tokens needs the policy's tokenizer (a transformers tokenizer with a chat "
            f"template) to count prompts, got {type(tokenizer).__name__}; pass tokenizer=..."
        )
    return max_prompt_tokens
