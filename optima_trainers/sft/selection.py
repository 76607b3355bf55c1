"""iSFT data selection (spec §5 item 4, §13 items 1-2).

Per instance the best trajectory by total reward (the first one on ties, as ``np.argmax``; with
``min_task_score``, among the trajectories scoring at least that), then:

* ``code`` order (reference code, default): sort the instances by that reward, descending; keep
  the slice ``keep`` of the sorted list (``(0.0, 0.7)``: the top 70%; MATH ``(0.1, 0.8)``: the
  10%-80% slice), with bounds ``int(fraction * n)``; then drop rewards below ``theta``.
* ``paper`` order (Alg. 2): drop rewards below ``theta`` first, then keep the slice of the
  survivors.

The threshold tests the TOTAL reward with ``>=`` (code, ``threshold_on="total"``); the paper's
Eq. 3 tests the task score strictly, ``R_task > theta`` (``threshold_on="task"``, spec §13 item 1).
Impersonation cleaning: the reward of a
trajectory in which an agent speaks for another carries the ``impersonation_sft`` flag (and -10,
:mod:`optima_env.reward`); with ``drop_impersonation`` such a trajectory is also removed after the
threshold, so that no threshold, however low, lets it through.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from optima_env.errors import DataError, EmptySelectionError
from optima_env.types import Episode
from optima_trainers.config.training import SelectionConfig

__all__ = [
    "best_per_instance",
    "draw_sample_id",
    "empty_selection_error",
    "no_task_credit_warning",
    "select_isft",
    "select_training_data",
]

IMPERSONATION_FLAG = "impersonation_sft"


def _total(episode: Episode) -> float:
    if episode.reward is None:
        raise DataError(
            f"episode {episode.sample_id} (seed {episode.seed}) has no reward; score the episodes "
            "with optima_env.reward.score_group before selecting"
        )
    return episode.reward.total


def draw_sample_id(sample_id: str, position: int, split_size: int) -> str:
    """The sample id of the draw at cursor ``position`` of a split of ``split_size`` instances.

    A stage that draws more instances than the split holds (ARC-C: 2000 draws of 1119 rows) plays
    some rows twice; as in the reference, every draw is its own group (its own best trajectory,
    its own place in the top 70%), so a repeated draw gets the id ``<id>@<cycle>``.

    >>> draw_sample_id("arc-7", 7, 10), draw_sample_id("arc-7", 17, 10)
    ('arc-7', 'arc-7@1')
    """
    cycle = position // split_size
    return sample_id if cycle == 0 else f"{sample_id}@{cycle}"


def _passes(episode: Episode, config: SelectionConfig) -> bool:
    if config.threshold_on == "task":
        return episode.task_score > config.theta
    return _total(episode) >= config.theta


def best_per_instance(episodes: Sequence[Episode]) -> list[Episode]:
    """The highest-reward episode of each instance (first on ties), in first-seen instance order."""
    best: dict[str, Episode] = {}
    for episode in episodes:
        current = best.get(episode.sample_id)
        if current is None or _total(episode) > _total(current):
            best[episode.sample_id] = episode
    return list(best.values())


def _slice(ranked: list[Episode], keep: tuple[float, float]) -> list[Episode]:
    n = len(ranked)
    return ranked[int(keep[0] * n) : int(keep[1] * n)]


def select_isft(episodes: Sequence[Episode], config: SelectionConfig | None = None) -> list[Episode]:
    """The iSFT training trajectories, best first (see the module docstring).

    >>> from optima_env.types import RewardBreakdown
    >>> def ep(sid, total):
    ...     r = RewardBreakdown(task=0, token=0, readability=0, total=total, num_tokens=1, normalizer=1)
    ...     return Episode(task_id="t", sample_id=sid, seed=0, agents=("A",), turns=(), final_answer=None,
    ...         gold=("x",), task_score=0, terminated=False, truncated=True, end_reason="max_turns",
    ...         num_tokens=1, system_prompts={}, base_system_prompts={}, reward=r)
    >>> [e.sample_id for e in select_isft([ep("a", .9), ep("b", .2), ep("c", .6)], SelectionConfig(theta=.5))]
    ['a', 'c']
    """
    config = config or SelectionConfig()
    if config.min_task_score is not None:
        episodes = [e for e in episodes if e.task_score >= config.min_task_score]
    ranked = sorted(best_per_instance(episodes), key=_total, reverse=True)
    if config.order == "code":
        chosen = [e for e in _slice(ranked, config.keep) if _passes(e, config)]
    else:
        chosen = _slice([e for e in ranked if _passes(e, config)], config.keep)
    if config.drop_impersonation:
        chosen = [e for e in chosen if IMPERSONATION_FLAG not in (e.reward.flags if e.reward else ())]
    return chosen


def select_training_data(episodes: Sequence[Episode], config: Mapping[str, Any]) -> list[Episode]:
    """:func:`select_isft` as a training stage uses it (the built-in selection hook; ``config``: the
    ``selection`` section as a dict, with the stage's name)."""
    return select_isft(episodes, SelectionConfig.from_mapping(config))


def empty_selection_error(episodes: Sequence[Episode], config: Mapping[str, Any]) -> EmptySelectionError:
    """The error of a stage whose selection kept none of ``episodes``: it names the best
    trajectory's value and the threshold, so the run stops with what to change instead of
    training on nothing and exiting as if it had worked. The first lever it names is
    ``min_task_score`` with a threshold the credited trajectories meet: lowering θ_sft alone lets
    trajectories whose task score is 0 train. Raised by the built-in backends, which train on the
    selection (a backend that chooses its own data, e.g. RFT, is not stopped)."""
    selection = SelectionConfig.from_mapping(config)
    task_threshold = selection.threshold_on == "task"
    best = max(e.task_score if task_threshold else _total(e) for e in episodes)
    tested = "task score (must be > theta)" if task_threshold else "total reward (must be >= theta)"
    extra = f", min_task_score={selection.min_task_score}" if selection.min_task_score is not None else ""
    return EmptySelectionError(
        f"the selection of stage {config.get('stage', '?')!r} kept none of its {len(episodes)} scored "
        f"trajectories: the best {tested} is {best:.4g}, selection.theta is {selection.theta}"
        f"{extra} (keep={list(selection.keep)}); nothing would train. {_levers(episodes, selection, best)}"
    )


def _floor(value: float) -> float:
    return math.floor(value * 100) / 100


def _levers(episodes: Sequence[Episode], selection: SelectionConfig, best: float) -> str:
    """What to change after an empty selection, the lever that keeps task credit first: a
    ``min_task_score`` with the θ_sft every credited instance's best trajectory meets, tried on
    these episodes before it is suggested."""
    lower = f"lowering the threshold alone (--theta-sft {_floor(best):g}) would train on task score 0"
    more = "sample more per instance (--samples) or more instances (--instances)"
    credited = best_per_instance([e for e in episodes if e.task_score > 0])
    if not credited:
        return (
            f"No trajectory scored above 0 on the task, so --min-task-score would keep none and {lower}: "
            f"{more}, or use a stronger --model or an easier task variant"
        )
    score = _total if selection.threshold_on == "total" else (lambda e: e.task_score - 1e-9)
    theta = _floor(min(score(e) for e in credited))
    kept = select_isft(episodes, replace(selection, min_task_score=_MIN_CREDIT, theta=theta))
    if not kept:
        return (
            f"Only {len(credited)} instance(s) have a trajectory with task credit, too few for the kept "
            f"slice {list(selection.keep)} under --min-task-score {_MIN_CREDIT:g}: {more}; {lower}"
        )
    return (
        f"Start a new run that keeps task credit: --min-task-score {_MIN_CREDIT:g} --theta-sft {theta:g} "
        f"(here it keeps {len(kept)} trajectories, all with task credit); {lower}; or {more}"
    )


_MIN_CREDIT = 1e-9
"""The ``min_task_score`` the messages suggest: any task credit at all (right or partly right)."""


def no_task_credit_warning(selected: Sequence[Episode], stage: str) -> str | None:
    """A warning line when over half of a stage's selected trajectories have task score 0 (the
    stage would learn mostly from conversations that got the task wrong), with the counts; None
    otherwise."""
    zero = sum(1 for e in selected if e.task_score <= 0)
    if not selected or 2 * zero <= len(selected):
        return None
    return (
        f"stage {stage!r}: the selection kept {len(selected)} trajectories, of which {zero} have task "
        f"score 0; the stage learns from conversations that got no task credit. --min-task-score "
        f"{_MIN_CREDIT:g} (selection.min_task_score) keeps only trajectories with some"
    )
