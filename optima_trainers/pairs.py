"""From tree pairs to a DPO dataset (spec §6.4).

:func:`select_top_pairs` keeps the better half of each tree's pairs, as the reference code does;
:func:`pairs_to_dpo_dataset` turns pairs into TRL's conversational preference format and splits
them 90/10 without shuffling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optima_env.errors import TaskContractError
from optima_trainers.types import PreferencePair

__all__ = ["DPODataset", "pairs_to_dpo_dataset", "select_top_pairs"]


def select_top_pairs(
    pairs_per_tree: Sequence[Sequence[PreferencePair]], fraction: float = 0.5
) -> list[PreferencePair]:
    """Per tree: sort its pairs by chosen value (best first) and keep ``int(fraction * n)`` of them;
    a tree with a single pair keeps it (the reference keeps the top half once ``int(0.7 n) >= 1``).

    Args:
        pairs_per_tree: the pairs of each tree (as :meth:`~optima_trainers.tree.Tree.pairs` gives them).
        fraction: the share kept per tree (0.5 in the reference).

    Returns:
        The kept pairs, tree after tree (ties keep their order within a tree).

    >>> from optima_trainers.types import PreferencePair
    >>> def pair(v):
    ...     return PreferencePair(prompt=(), chosen="a", rejected="b", chosen_value=v, rejected_value=0.0,
    ...                           task_id="t", sample_id="s", instance_index=0, depth=0, agent="Alice")
    >>> [p.chosen_value for p in select_top_pairs([[pair(0.5), pair(0.9), pair(0.7)], [pair(0.6)]])]
    [0.9, 0.6]
    """
    if not 0 < fraction <= 1:
        raise TaskContractError(f"fraction must lie in (0, 1], got {fraction!r}")
    kept: list[PreferencePair] = []
    for pairs in pairs_per_tree:
        ranked = sorted(pairs, key=lambda p: p.chosen_value, reverse=True)
        keep = len(ranked) if len(ranked) < 2 else int(fraction * len(ranked))
        kept.extend(ranked[:keep])
    return kept


@dataclass(frozen=True, slots=True, kw_only=True)
class DPODataset:
    """Rows in TRL's conversational preference format: ``{"prompt", "chosen", "rejected"}``."""

    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]


def pairs_to_dpo_dataset(pairs: Sequence[PreferencePair], *, train_fraction: float = 0.9) -> DPODataset:
    """TRL rows, the first ``int(train_fraction * n)`` (at least one) for training, the rest for
    evaluation, in the given order (the reference does not shuffle).

    Each row is ``{"prompt": [system, turn, ...], "chosen": [{"role": "assistant", "content": ...}],
    "rejected": [...]}``: the prompt is everything but the last message, the completions the single
    next turn (spec §6.4).
    """
    if not 0 < train_fraction <= 1:
        raise TaskContractError(f"train_fraction must lie in (0, 1], got {train_fraction!r}")
    rows = [
        {
            "prompt": [dict(m) for m in p.prompt],
            "chosen": [{"role": "assistant", "content": p.chosen}],
            "rejected": [{"role": "assistant", "content": p.rejected}],
        }
        for p in pairs
    ]
    cut = max(1, int(train_fraction * len(rows))) if rows else 0
    return DPODataset(train=rows[:cut], eval=rows[cut:])
