"""Self-consistency helpers: greedy answer clustering and majority vote (spec 8.2, 8.3).

An answer joins the first existing group that has a member similar enough to it (similarity
``>= threshold``, or ``> threshold`` with ``strict=True``); otherwise it opens a new group. The
paper's SC baseline uses pairwise F1 ``> 0.9`` (``strict=True``); the inference-scaling analysis
uses ``>= 0.9`` with F1 for IE tasks and exact match otherwise (the default).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from numbers import Real
from typing import TypeVar

from optima_env.errors import ScoringError

__all__ = ["cluster_answers", "majority_vote"]

T = TypeVar("T")


def cluster_answers(
    answers: Sequence[T],
    similarity: Callable[[T, T], float],
    threshold: float = 0.9,
    *,
    strict: bool = False,
) -> list[list[int]]:
    """Group answers greedily by similarity.

    Args:
        answers: The sampled answers, in sampling order.
        similarity: ``similarity(candidate, member) -> float``, e.g. ``f1`` or ``exact_match``.
            It receives the answers as given, so filter out ``None`` first if it cannot take it.
        threshold: The similarity needed to join a group.
        strict: Require similarity ``> threshold`` instead of ``>=``.

    Returns:
        Groups of indices into ``answers``, in order of creation, each in ascending order.

    Raises:
        ScoringError: If ``answers`` is not a sequence, ``similarity`` is not callable,
            ``threshold`` is not a finite number, or ``similarity`` returns a non-number.

    >>> from optima_env.scoring import exact_match
    >>> cluster_answers(["Paris", "Lyon", "paris."], exact_match)
    [[0, 2], [1]]
    """
    _check_arguments(answers, similarity, threshold)
    groups: list[list[int]] = []
    for index, answer in enumerate(answers):
        for group in groups:
            if any(_similar(similarity, answer, answers[m], threshold, strict) for m in group):
                group.append(index)
                break
        else:
            groups.append([index])
    return groups


def majority_vote(
    answers: Sequence[T],
    *,
    similarity: Callable[[T, T], float],
    threshold: float = 0.9,
    strict: bool = False,
) -> tuple[int, list[int]]:
    """Pick the largest group of :func:`cluster_answers`; ties go to the earliest group.

    Args:
        answers: The sampled answers (at least one).
        similarity: As in :func:`cluster_answers`.
        threshold: As in :func:`cluster_answers`.
        strict: As in :func:`cluster_answers`.

    Returns:
        ``(representative_index, group)``: the group's first member and the group's indices. The
        SC score is usually the mean correctness of the group's members.

    Raises:
        ScoringError: If ``answers`` is empty, or as :func:`cluster_answers`.

    >>> from optima_env.scoring import exact_match
    >>> majority_vote(["4", "5", "5"], similarity=exact_match)
    (1, [1, 2])
    """
    if isinstance(answers, Sequence) and not isinstance(answers, str) and not answers:
        raise ScoringError(
            "majority_vote: expected at least one answer, got an empty sequence; "
            "sample answers first or skip the instance"
        )
    groups = cluster_answers(answers, similarity, threshold, strict=strict)
    best = max(groups, key=len)  # max keeps the first of equally large groups
    return best[0], best


def _check_arguments(answers: object, similarity: object, threshold: object) -> None:
    if isinstance(answers, str) or not isinstance(answers, Sequence):
        raise ScoringError(
            f"cluster_answers: expected answers to be a sequence (list/tuple), got "
            f"{type(answers).__name__}; pass the sampled answers as a list"
        )
    if not callable(similarity):
        raise ScoringError(
            f"cluster_answers: expected similarity to be callable (a, b) -> float, got "
            f"{type(similarity).__name__}; pass e.g. optima_env.scoring.f1"
        )
    if isinstance(threshold, bool) or not isinstance(threshold, Real):
        raise ScoringError(f"cluster_answers: expected threshold to be a number, got {threshold!r}; e.g. 0.9")
    if not math.isfinite(float(threshold)):
        raise ScoringError(f"cluster_answers: expected a finite threshold, got {threshold!r}")


def _similar(similarity: Callable[[T, T], float], a: T, b: T, threshold: float, strict: bool) -> bool:
    value = similarity(a, b)
    if not isinstance(value, Real):  # bools count as 0/1
        raise ScoringError(
            f"cluster_answers: expected similarity to return a number, got "
            f"{type(value).__name__} {value!r}; wrap it to return a float"
        )
    return value > threshold if strict else value >= threshold
