"""From tree pairs to a DPO dataset (spec §6.4).

:func:`candidate_pairs` applies the pair rules to a tree (the reference's thresholds, and the
switches beyond it: visits, capped and depth-cut turns, task credit);
:func:`select_top_pairs` keeps the better half of each tree's pairs, as the reference code does;
:func:`pairs_to_dpo_dataset` turns pairs into TRL's conversational preference format and splits
them 90/10 without shuffling. :func:`pair_details` and :func:`append_pair_details` record every
candidate pair of a tree stage, kept or dropped, in its ``pairs_detail.jsonl``
(:class:`~optima_trainers.run.records.PairDetail`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from optima_env.errors import DataError, TaskContractError
from optima_env.io import append_jsonl, read_jsonl, read_text, write_text_atomic
from optima_trainers.run.records import PAIR_REASONS, PairCandidate, PairDetail, PairSide, PreferencePair

__all__ = [
    "PAIR_DETAILS",
    "DPODataset",
    "append_pair_details",
    "candidate_pairs",
    "pair_details",
    "pair_side",
    "pair_summary",
    "pairs_to_dpo_dataset",
    "prune_pair_details",
    "read_pair_details",
    "select_top_pairs",
    "top_pair_indices",
]

PAIR_DETAILS = "pairs_detail.jsonl"
"""A tree stage's record of every candidate pair (:class:`~optima_trainers.run.records.PairDetail`)."""

# Trees and nodes (optima_trainers.tree.nodes) are typed Any here: tree imports this module (one-way).


def candidate_pairs(
    tree: Any,
    theta_filter: float | None = None,
    theta_diff: float | None = None,
    *,
    minmax: Literal["exact", "code"] | None = None,
    train_capped_turns: bool = True,
) -> list[PairCandidate]:
    """Every pair the pair rule proposes from the nodes of ``tree.pair_parents()`` (root
    included), in creation order, kept or not, with why it is dropped
    (:data:`~optima_trainers.run.records.PAIR_REASONS`).

    ``pair_rule="per_parent"`` (the reference, spec §6.4): at most one pair per node, its
    max-value child (chosen) against its min-value child (rejected), among the children with
    at least ``tree.min_pair_visits`` visits (``minmax="exact"``; with ``"code"``, the tracked
    ones, dropped when either has fewer); when fewer than two children have enough visits, the
    pair of all children is proposed and dropped for ``visits``. ``"shared_ancestor"`` (the
    paper, §13 item 7): every two children of a node (they share the whole history up to it,
    which is the pair's prompt), the higher-value one chosen; in child order, the first of two
    equal values chosen. A pair is kept when ``chosen > theta_filter`` and ``chosen - rejected
    > theta_diff`` (the reference's rules) and, beyond the reference:

    * ``tree.min_pair_visits``: both sides have that many visits (a value averaged over
      that many rollouts);
    * ``train_capped_turns=False`` (the run's ``sft.train_capped_turns``, one home for both
      stages): the chosen turn did not run to the generation cap (:attr:`~optima_trainers.tree.nodes.Node.capped`), and
      not every trajectory through the chosen side was cut at the depth limit;
    * ``tree.pair_task_credit``: the chosen side's task credit (:attr:`~optima_trainers.tree.nodes.Node.task_credit`)
      exceeds the rejected side's by more than ``tree.pair_task_gap`` (0: by anything).

    Thresholds and ``minmax`` default to ``tree.search``'s.
    """
    search = tree.search
    theta_filter = search.theta_filter if theta_filter is None else theta_filter
    theta_diff = search.theta_diff if theta_diff is None else theta_diff
    out = []
    for node in tree.pair_parents():
        candidates = _proposed(tree, node, minmax or search.minmax)
        prompt = tuple(tree.prompt_messages(node))
        for best, worst in candidates:
            credit_gap = best.task_credit - worst.task_credit
            reasons = [
                name
                for name, fails in (
                    ("visits", min(best.visits, worst.visits) < search.min_pair_visits),
                    ("theta_filter", not best.value > theta_filter),
                    ("theta_diff", not best.value - worst.value > theta_diff),
                    ("capped", not train_capped_turns and best.capped),
                    ("depth_cut", not train_capped_turns and best.depth_cuts == best.visits),
                    ("task_credit", search.pair_task_credit and not credit_gap > search.pair_task_gap),
                )
                if fails
            ]
            pair = PreferencePair(
                prompt=prompt,
                chosen=best.text,
                rejected=worst.text,
                chosen_value=best.value,
                rejected_value=worst.value,
                task_id=tree.task_id,
                sample_id=tree.sample_id,
                instance_index=tree.index,
                depth=node.depth,
                agent=tree.speaker(node),
            )
            out.append(PairCandidate(pair=pair, chosen=pair_side(best), rejected=pair_side(worst),
                                     reasons=tuple(reasons)))  # fmt: skip
    return out


def _proposed(tree: Any, node: Any, minmax: Literal["exact", "code"]) -> list[tuple[Any, Any]]:
    """(chosen, rejected) children the pair rule proposes at ``node``."""
    kids = node.children
    if tree.search.pair_rule == "shared_ancestor":
        return [(a, b) if a.value >= b.value else (b, a) for i, a in enumerate(kids) for b in kids[i + 1 :]]
    eligible = [c for c in kids if c.visits >= tree.search.min_pair_visits]
    if minmax == "exact" and len(eligible) >= 2:  # as best_and_worst: the first of equals
        best, worst = max(eligible, key=lambda n: n.value), min(eligible, key=lambda n: n.value)
    else:
        best, worst = node.best_and_worst(minmax)
    return [] if best is worst else [(best, worst)]


def pair_side(node: Any) -> PairSide:
    """A node as a pair side: its value, visits, task credit, mean reward terms and flags."""
    return PairSide(
        node=node.id,
        text=node.text,
        value=node.value,
        visits=node.visits,
        task=node.task_credit,
        token=node.mean_term("token"),
        readability=node.mean_term("readability"),
        capped=node.capped,
        depth_cuts=node.depth_cuts,
    )


def top_pair_indices(values: Sequence[float], fraction: float) -> list[int]:
    """Positions of the pairs :func:`select_top_pairs` keeps of one tree's pairs with chosen
    values ``values``, best first (ties in their order).

    >>> top_pair_indices([0.5, 0.9, 0.7], 0.5)
    [1]
    """
    if not 0 < fraction <= 1:
        raise TaskContractError(f"fraction must lie in (0, 1], got {fraction!r}")
    ranked = sorted(range(len(values)), key=lambda i: values[i], reverse=True)
    return ranked[: len(ranked) if len(ranked) < 2 else int(fraction * len(ranked))]


def select_top_pairs(
    pairs_per_tree: Sequence[Sequence[PreferencePair]], fraction: float = 0.5
) -> list[PreferencePair]:
    """Per tree: sort its pairs by chosen value (best first) and keep ``int(fraction * n)`` of them;
    a tree with a single pair keeps it (the reference keeps the top half once ``int(0.7 n) >= 1``).

    Args:
        pairs_per_tree: the pairs of each tree (as :meth:`~optima_trainers.tree.nodes.Tree.pairs` gives them).
        fraction: the share kept per tree (0.5 in the reference).

    Returns:
        The kept pairs, tree after tree (ties keep their order within a tree).

    >>> from optima_trainers.run.records import PreferencePair
    >>> def pair(v):
    ...     return PreferencePair(prompt=(), chosen="a", rejected="b", chosen_value=v, rejected_value=0.0,
    ...                           task_id="t", sample_id="s", instance_index=0, depth=0, agent="Alice")
    >>> [p.chosen_value for p in select_top_pairs([[pair(0.5), pair(0.9), pair(0.7)], [pair(0.6)]])]
    [0.9, 0.6]
    """
    kept: list[PreferencePair] = []
    for pairs in pairs_per_tree:
        kept.extend(pairs[i] for i in top_pair_indices([p.chosen_value for p in pairs], fraction))
    return kept


@dataclass(frozen=True, slots=True, kw_only=True)
class DPODataset:
    """Rows in TRL's conversational preference format: ``{"prompt", "chosen", "rejected"}``."""

    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]


def pairs_to_dpo_dataset(
    pairs: Sequence[PreferencePair], *, train_fraction: float = 0.9, credited: bool = False
) -> DPODataset:
    """TRL rows, the first ``int(train_fraction * n)`` (at least one) for training, the rest for
    evaluation, in the given order (the reference does not shuffle).

    Each row is ``{"prompt": [system, turn, ...], "chosen": [{"role": "assistant", "content": ...}],
    "rejected": [...]}``: the prompt is everything but the last message, the completions the single
    next turn (spec §6.4). With ``credited`` (``dpo.rpo_scope="credited"``) each row also has
    ``nll_weight``: 1.0 when the pair's chosen side has task credit (``chosen_task > 0``), else 0.0.
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
    if credited:
        missing = sum(p.chosen_task is None for p in pairs)
        if missing:
            raise DataError(
                f"{missing} of {len(pairs)} pairs carry no chosen_task, which dpo.rpo_scope='credited' "
                "needs; regenerate the tree stage with dpo.rpo_scope=credited (it writes them), or use 'all'"
            )
        rows = [r | {"nll_weight": float(p.chosen_task > 0)} for r, p in zip(rows, pairs, strict=True)]
    cut = max(1, int(train_fraction * len(rows))) if rows else 0
    return DPODataset(train=rows[:cut], eval=rows[cut:])


def pair_details(
    trees: Sequence[Any], *, chunk: int, fraction: float, train_capped_turns: bool = True
) -> list[PairDetail]:
    """Every candidate pair of ``trees`` (one chunk of a tree stage), each marked ``selected`` when
    it is among its tree's top ``fraction`` of kept pairs (:func:`select_top_pairs`)."""
    out = []
    for tree in trees:
        candidates = tree.pair_candidates(train_capped_turns=train_capped_turns)
        kept = [i for i, c in enumerate(candidates) if c.kept]
        top = {kept[j] for j in top_pair_indices([candidates[i].pair.chosen_value for i in kept], fraction)}
        out += [PairDetail.of(c, chunk=chunk, selected=i in top) for i, c in enumerate(candidates)]
    return out


def append_pair_details(path: str | os.PathLike[str], details: Iterable[PairDetail]) -> None:
    """Append pair records to ``path`` (a tree stage writes a chunk's before the chunk's line of
    ``trees.jsonl``, and :func:`prune_pair_details` drops them again if that line never came)."""
    append_jsonl(path, [d.to_dict() for d in details])


def prune_pair_details(path: str | os.PathLike[str], chunks: set[int]) -> None:
    """Keep only the records of the finished ``chunks`` (a resumed stage regrows the others, and
    appends their records again), and drop a torn last line; rewritten only when something goes."""
    path = Path(path)
    if not path.is_file():
        return
    details = read_pair_details(path)
    kept = [d for d in details if d.chunk in chunks]
    text = read_text(path)
    if len(kept) != len(details) or (text and not text.endswith("\n")) or len(kept) != text.count("\n"):
        write_text_atomic(path, "".join(json.dumps(d.to_dict(), ensure_ascii=False) + "\n" for d in kept))


def read_pair_details(path: str | os.PathLike[str]) -> list[PairDetail]:
    """The records of a stage's ``pairs_detail.jsonl`` (a torn last line is skipped)."""
    return read_jsonl(path, PairDetail.from_dict, fix="delete it; a resumed stage cannot rebuild it")


def pair_summary(details: Sequence[PairDetail]) -> dict[str, float]:
    """A tree stage's pairs in a few numbers, for its stage record (``mcts/*``, the tracker and the
    demo's committed ``training.json``): the candidate pairs and how many each rule drops
    (``mcts/dropped/<reason>``, a pair may fail several), and over the selected pairs (the stage's
    ``pairs.jsonl``) the mean gap of the value and of each reward term (``mcts/gap/<term>``: what
    decides the pairs, task or length or readability), the mean visits of a side, and the share
    whose chosen side earned more task than the rejected one (``mcts/task_credited``).

    >>> pair_summary([])
    {'mcts/candidates': 0.0}
    """
    out = {"mcts/candidates": float(len(details))}
    if not details:
        return out
    out |= {f"mcts/dropped/{r}": float(sum(r in d.reasons for d in details)) for r in PAIR_REASONS}
    selected = [d for d in details if d.selected]
    if not selected:
        return out
    gaps = [d.gap() for d in selected]
    for term in ("total", "task", "token", "readability"):
        values = [g[term] for g in gaps if g[term] is not None]
        if values:
            out[f"mcts/gap/{term}"] = sum(values) / len(values)
    out["mcts/visits"] = sum(d.chosen.visits + d.rejected.visits for d in selected) / (2 * len(selected))
    out["mcts/task_credited"] = sum(d.chosen.task > d.rejected.task for d in selected) / len(selected)
    return out
