"""The one episode scorer: readability, token normalizer, reward and the scored event, in that order.

Every trainer path scores with :class:`EpisodeScorer`: the host's sampled stages (per-instance max
normalizer over each instance's N samples, spec §3), the tree search (a constant normalizer, spec
§6.3, or the paper's running per-instance max, §13 item 3, with turn losses cached by text because
a tree replays its prefixes) and the TRL adapter's groups. :func:`optima_env.reward.score_episode`
stays the formula; this class only assembles its inputs the same way everywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Literal

from optima_env.errors import ScoringError
from optima_env.readability import max_turn_loss, score_turns
from optima_env.reward import RewardConfig, instance_max_normalizer, score_episode
from optima_env.types import Episode

__all__ = ["EpisodeScorer"]

Readability = Callable[[Sequence[str]], Sequence[float]]
"""A frozen model's per-turn LM losses: ``texts -> losses`` (one per text, same order)."""


class EpisodeScorer:
    """Scores finished episodes with the Optima reward; returns them with ``lm_loss`` and ``reward``.

    Args:
        config: the reward (weights and special cases).
        readability: the frozen base model's per-turn losses; ``None`` keeps each episode's own
            ``lm_loss`` (the readability term is 0, flagged ``no_readability``, when that is missing).
        normalizer: the token normalizer: ``"group"`` (the max #tokens over the episodes of the
            same instance in one :meth:`score` call: the N samples of a sampled stage or a TRL
            group), ``"running"`` (the max over every episode of the instance scored so far: the
            paper's tree normalizer), or a constant (the reference's tree normalizer, or an env's).
        cache_turns: keep every turn's loss by text across calls and score each new text once
            (exact: a turn is scored alone; a tree replays its prefix turns in every rollout);
            ``False`` scores each call's turns in order, duplicates included.
        on_scored: called with each scored episode, in input order (the host's
            ``optima_episode_scored`` event).
    """

    config: RewardConfig
    """The reward."""
    readability: Readability | None
    """The per-turn loss scorer, if any."""
    normalizer: float | Literal["group", "running"]
    """How the token normalizer is set."""

    def __init__(
        self,
        config: RewardConfig,
        *,
        readability: Readability | None = None,
        normalizer: float | Literal["group", "running"] = "group",
        cache_turns: bool = False,
        on_scored: Callable[[Episode], None] | None = None,
    ) -> None:
        if normalizer not in ("group", "running") and not (
            isinstance(normalizer, (int, float)) and not isinstance(normalizer, bool) and normalizer > 0
        ):
            raise ScoringError(f"normalizer must be 'group', 'running' or a number > 0, got {normalizer!r}")
        self.config, self.readability, self.normalizer = config, readability, normalizer
        self._cache: dict[str, float] | None = {} if cache_turns else None
        self._running: dict[str, float] = {}
        self._on_scored = on_scored

    def readable(self, episodes: Sequence[Episode]) -> list[Episode]:
        """The episodes with ``lm_loss`` filled in by the readability scorer (unchanged without
        one), and no reward (an env played with ``scoring=False``)."""
        losses = self._turn_losses(episodes)
        return list(episodes) if losses is None else self._with_losses(episodes, losses)

    def score(self, episodes: Sequence[Episode], *, group: Sequence[Episode] | None = None) -> list[Episode]:
        """The episodes with ``lm_loss`` (when a readability scorer is set) and ``reward`` filled in.

        ``group`` (``"group"`` normalizer only): the episodes whose per-instance maxima set the
        normalizer, when they are more than those scored (a rank scoring its shard of a stage whose
        instances' samples lie on several ranks); default: the scored episodes themselves."""
        if group is not None and self.normalizer != "group":
            raise ScoringError(
                f"group= sets the 'group' normalizer's maxima, but this scorer's normalizer is "
                f"{self.normalizer!r}; score without group=, or build the scorer with normalizer='group'"
            )
        losses = self._turn_losses(episodes)
        if losses is not None:
            episodes = self._with_losses(episodes, losses)
        per_turn = losses if losses is not None else [None] * len(episodes)
        scored = [
            dataclasses.replace(e, reward=score_episode(e, config=self.config, normalizer=n, turn_losses=ls))
            for e, n, ls in zip(episodes, self._normalizers(episodes, group), per_turn)
        ]
        if self._on_scored is not None:
            for episode in scored:
                self._on_scored(episode)
        return scored

    def __call__(self, episodes: Sequence[Episode]) -> list[float]:
        """The total rewards (a ``reward_fn`` of :func:`optima_trainers.tree.search.build_trees`)."""
        return [e.reward.total for e in self.score(episodes) if e.reward is not None]

    @staticmethod
    def _with_losses(episodes: Sequence[Episode], losses: Sequence[Sequence[float]]) -> list[Episode]:
        return [dataclasses.replace(e, lm_loss=max_turn_loss(ls)) for e, ls in zip(episodes, losses)]

    def _turn_losses(self, episodes: Sequence[Episode]) -> list[list[float]] | None:
        if self.readability is None:
            return None
        texts = [[t.text for t in e.turns] for e in episodes]
        if self._cache is None:
            flat = score_turns(self.readability, [t for turns in texts for t in turns])
            out, pos = [], 0
            for turns in texts:
                out.append(flat[pos : pos + len(turns)])
                pos += len(turns)
            return out
        missing = sorted({t for turns in texts for t in turns} - set(self._cache))
        self._cache.update(zip(missing, score_turns(self.readability, missing)))
        return [[self._cache[t] for t in turns] for turns in texts]

    def _normalizers(self, episodes: Sequence[Episode], group: Sequence[Episode] | None) -> list[float]:
        if not isinstance(self.normalizer, str):
            return [float(self.normalizer)] * len(episodes)
        if self.normalizer == "running":
            for e in episodes:  # the max so far, this episode included (as the tree grows)
                own = instance_max_normalizer([e], config=self.config)
                self._running[e.sample_id] = max(self._running.get(e.sample_id, 0.0), own)
            return [self._running[e.sample_id] for e in episodes]
        groups: dict[str, list[Episode]] = {}
        for e in episodes if group is None else group:
            groups.setdefault(e.sample_id, []).append(e)
        maxima = {sid: instance_max_normalizer(same, config=self.config) for sid, same in groups.items()}
        return [maxima[e.sample_id] for e in episodes]
