"""The ``tree`` section of the trainer configuration (:mod:`optima_trainers.config.train`): the
tree-search stages' settings.

A leaf module, like :mod:`optima_trainers.config.sections` (the ``generation`` section), so that
the tree code (:mod:`optima_trainers.tree.nodes`, :mod:`optima_trainers.tree.search`) takes the
section as it is without importing the rest of the configuration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from optima_env.configtree import check_number, check_positive_int
from optima_env.reward import RewardConfig

__all__ = ["TreeSearchConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeSearchConfig:
    """Tree-search stages (spec §6): the token normalizer, the MCTS turn trees and the pair rules;
    the one declaration of these settings, read by the CLI, :func:`optima_trainers.tree.search.build_trees`
    and :class:`optima_trainers.tree.nodes.Tree` alike. Sampling caps, temperature, depth (``max_turns``),
    termination and message format come from ``generation``; the reward from ``reward``
    (:meth:`reward_of`)."""

    instances: int = 10000
    """Instances (one tree each) per stage (``monte_sample_count``)."""
    normalizer_instances: int = 100
    """Fresh instances played once each to set the token normalizer (spec §6.3)."""
    normalizer: Literal["percentile", "instance_max"] = "percentile"
    """The tree reward's token normalizer (spec §13 item 3): the constant percentile of fresh
    conversations (``percentile``, the reference) or the per-instance max over the tree's rollouts
    so far (``instance_max``, the paper; no normalizer conversations are played)."""
    normalizer_percentile: float = 85.0
    """Percentile of their token counts, plus 1 (iDPO 85, iSFT-DPO 80)."""
    normalizer_rounding: Literal["int", "float"] = "int"
    """``int``: ``int(percentile) + 1`` as the reference computes it; ``float``: unrounded + 1."""
    selections: int = 8
    """Select-simulate-back-propagate rounds per tree."""
    rollouts: int = 3
    """Conversations played from each selected node."""
    top_k: int = 10
    """Candidates (by value) the softmax selection samples from."""
    select_edit_threshold: float = 0.25
    """A candidate this close to an already selected node (``ed / (max len + 1)``) is dropped."""
    merge_edit_threshold: float = 0.1
    """A new turn this close to an existing sibling (``ed / (len(new) + 1)``) is merged into it."""
    edit_distance: Literal["plus_one", "max_length"] = "plus_one"
    """Edit-distance normalization (spec §13 item 8): the reference's ``+ 1`` forms above, or the
    paper's division by the longer length (both the filter and the merge)."""
    depth_cut: Literal["error", "last_answer"] = "error"
    """A rollout cut at the depth limit without agreement: final answer ``"error"`` (the reference,
    scored by the task), or its current answer."""
    filtered_parents: Literal["drop", "keep"] = "drop"
    """A node the selection's similarity filter removed is never a pair parent unless it was
    selected (``drop``, the reference), or stays one (``keep``)."""
    minmax: Literal["exact", "code"] = "code"
    """How pairs pick the max/min-value child: as tracked during back-propagation (``code``, the
    reference; can be stale) or recomputed from the final values (``exact``)."""
    pair_rule: Literal["per_parent", "shared_ancestor"] = "per_parent"
    """Pairs (spec §13 item 7): each node's best vs worst child (``per_parent``, the reference), or
    every two children of a node, which share its whole history (``shared_ancestor``, the paper)."""
    lambda_token: float | None = None
    """The tree reward's own λ_token, where a recipe gives the tree search a weight other than the
    run's (spec §6.5 Table 8: ARC-C's iDPO trees use 0.4 where its iSFT initialization uses 0.5).
    ``None`` (the default): ``reward.lambda_token``. Setting ``reward.lambda_token`` yourself (a
    ``--set``, a flag or ``overrides``) also clears a recipe's value here, so that your weight
    reaches every reward of the run; set both to keep them apart."""
    lambda_loss: float | None = None
    """The tree reward's own λ_loss (as :attr:`lambda_token`); ``None``: ``reward.lambda_loss``."""
    theta_filter: float = 0.4
    """θ_dpo-filter: minimum value of the chosen node."""
    theta_diff: float = 0.2
    """θ_dpo-diff: minimum value gap of a pair."""
    pair_fraction: float = 0.5
    """Pairs kept per tree (the top ones by chosen value)."""
    min_pair_visits: int = 1
    """A child with fewer visits (trajectories through it) is no pair side, so that a pair's values
    are means over that many rollouts, not one conversation's reward; 1: every child (reference)."""
    pair_task_credit: bool = False
    """Keep a pair only when its chosen side's task credit (the mean task term of the trajectories
    through it) exceeds the rejected side's: the DPO counterpart of ``selection.min_task_score``.
    False: values alone decide (reference). Capped turns follow ``sft.train_capped_turns``."""
    pair_task_gap: float = 0.0
    """With ``pair_task_credit``: how much more task credit the chosen side must have than the
    rejected side (the credit difference must exceed it). 0: any positive difference. A tiny
    difference leaves the pair's value gap to the token and readability terms."""

    def __post_init__(self) -> None:
        for name in ("instances", "normalizer_instances", "selections", "rollouts", "top_k"):
            check_positive_int(f"tree.{name}", getattr(self, name))
        check_number("tree.normalizer_percentile", self.normalizer_percentile, low=0.0, high=100.0)
        for name in ("select_edit_threshold", "merge_edit_threshold"):
            check_number(f"tree.{name}", getattr(self, name), low=0.0)
        check_number("tree.theta_filter", self.theta_filter)
        check_number("tree.theta_diff", self.theta_diff, low=0.0)
        check_number("tree.pair_fraction", self.pair_fraction, low=0.0, high=1.0, low_open=True)
        check_positive_int("tree.min_pair_visits", self.min_pair_visits)
        check_number("tree.pair_task_gap", self.pair_task_gap, low=0.0)
        for name in ("lambda_token", "lambda_loss"):
            if getattr(self, name) is not None:
                check_number(f"tree.{name}", getattr(self, name), low=0.0)

    def reward_of(self, run: RewardConfig) -> RewardConfig:
        """The reward of tree trajectories, derived from the run's reward ``run``: the same weights
        and special cases, except that an impersonating turn zeroes the task term
        (``impersonation="mcts"``, the reference's tree-search scoring, spec §3) where the run's
        reward subtracts 10 (``"sft"``), and this section's weights where they are set. The token
        normalizer is the tree stage's (:attr:`normalizer`)."""
        changes: dict[str, Any] = {}
        if run.impersonation == "sft":
            changes["impersonation"] = "mcts"
        for name in ("lambda_token", "lambda_loss"):
            if getattr(self, name) is not None:
                changes[name] = getattr(self, name)
        return dataclasses.replace(run, **changes) if changes else run
