"""The tree search's reward and token normalizer (spec §3 MCTS variant, §6.3).

:class:`MCTSReward` scores batches of finished tree rollouts (the Optima reward with the constant
normalizer, or the paper's per-instance max); :func:`estimate_token_normalizer` plays the fresh
conversations that set the constant. Both are re-exported by :mod:`optima_trainers.mcts`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from optima_env.policy import ChatPolicy, SamplingParams
from optima_env.readability import max_turn_loss, score_turns
from optima_env.reward import RewardConfig, instance_max_normalizer, percentile_normalizer, score_episode
from optima_env.rollout import make_jobs, rollout
from optima_env.task import Task
from optima_env.types import Episode

__all__ = ["MCTSReward", "estimate_token_normalizer"]


class MCTSReward:
    """A ``reward_fn`` for :func:`build_trees`: the Optima reward with a constant token normalizer.

    Readability losses are computed for all turns of a batch of episodes in one call and cached
    by turn text (each turn is scored alone, so the cache is exact; the replayed prefix turns of a
    tree are scored once). The per-turn losses also go to
    :func:`~optima_env.reward.score_episode`, so the reference's turn scan
    (``RewardConfig.mcts_turn_scan``) scores the readability of the turns before an impersonating one.

    Args:
        normalizer: the constant token normalizer (the reference, see
            :func:`estimate_token_normalizer`), or ``None`` for the paper's per-instance max
            (spec §13 item 3): the max #tokens over the tree's rollouts so far, this batch included
            (without ``large`` ones when ``config.normalizer_excludes_large``).
        config: reward weights and special cases (default: the code preset with
            ``impersonation="mcts"``, which zeroes the task term of an impersonating trajectory).
        readability: a scorer ``texts -> losses`` (e.g. the frozen base model's
            :class:`~optima_env.readability.TransformersLMLoss`), or ``None`` to use the episodes'
            own ``lm_loss`` (the readability term is 0 when that is missing, flagged ``no_readability``).
    """

    def __init__(
        self,
        *,
        normalizer: float | None,
        config: RewardConfig | None = None,
        readability: Callable[[Sequence[str]], Sequence[float]] | None = None,
    ) -> None:
        self.normalizer = normalizer
        self.config = config or RewardConfig(impersonation="mcts")
        self.readability = readability
        self._losses: dict[str, float] = {}
        self._max_tokens: dict[str, float] = {}

    def score(self, episodes: Sequence[Episode]) -> list[Episode]:
        """The episodes with ``lm_loss`` (when a scorer is set) and ``reward`` filled in."""
        losses: list[list[float] | None] = [None] * len(episodes)
        if self.readability is not None:
            missing = sorted({t.text for e in episodes for t in e.turns} - set(self._losses))
            self._losses.update(zip(missing, score_turns(self.readability, missing)))
            losses = [[self._losses[t.text] for t in e.turns] for e in episodes]
            episodes = [replace(e, lm_loss=max_turn_loss(ls or [])) for e, ls in zip(episodes, losses)]
        if self.normalizer is None:
            for e in episodes:
                tree_max = max(
                    self._max_tokens.get(e.sample_id, 0.0), instance_max_normalizer([e], config=self.config)
                )
                self._max_tokens[e.sample_id] = tree_max
        return [
            replace(
                e,
                reward=score_episode(
                    e,
                    config=self.config,
                    normalizer=self.normalizer or self._max_tokens[e.sample_id],
                    turn_losses=ls,
                ),
            )
            for e, ls in zip(episodes, losses)
        ]

    def __call__(self, episodes: Sequence[Episode]) -> list[float]:
        return [e.reward.total for e in self.score(episodes) if e.reward is not None]


def estimate_token_normalizer(
    task: Task,
    policy: ChatPolicy,
    instance_indices: Sequence[int],
    *,
    percentile: float = 85.0,
    rounding: Literal["int", "float"] = "int",
    split: str = "train",
    seed: int = 0,
    sampling: SamplingParams | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> tuple[float, list[Episode]]:
    """The MCTS token normalizer (spec §6.3): one conversation per instance with the current model,
    then the ``percentile`` of their token counts plus 1 (85 for iDPO, 80 for iSFT-DPO), as
    ``int(percentile) + 1`` (``rounding="int"``, the reference) or unrounded (``"float"``).

    Returns:
        ``(normalizer, episodes)``.
    """
    episodes = rollout(
        task,
        policy,
        jobs=make_jobs(instance_indices, num_samples=1, seed=seed),
        sampling=sampling or SamplingParams(temperature=0.7, max_new_tokens=2000, seed=seed),
        env_kwargs={"split": split, **dict(env_kwargs or {})},
        progress=progress,
    )
    return percentile_normalizer([e.num_tokens for e in episodes], percentile, rounding=rounding), episodes
