"""The Optima reward (spec §3): task score, token cost and readability.

Eq. (1) of the paper::

    R(τ) = R_task(τ) − λ_token · #Tokens(τ) / normalizer + λ_loss / R_loss(τ)

:func:`optima_reward` is that formula and nothing else. :class:`RewardConfig` adds the reference
code's special cases, each a named switch, with ``code`` (default) and ``paper`` presets;
:func:`score_episode` applies it to one episode, :func:`score_group` to the N samples of one
instance with the per-instance max normalizer, and :func:`percentile_normalizer` gives the MCTS
constant normalizer of spec §6.3.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from optima_env.errors import ScoringError
from optima_env.types import Episode, RewardBreakdown, Turn

__all__ = [
    "LARGE_TURN_MARKER",
    "PAPER_SPECIAL_CASES",
    "RewardConfig",
    "instance_max_normalizer",
    "is_impersonating",
    "optima_reward",
    "percentile_normalizer",
    "score_episode",
    "score_group",
]

LARGE_TURN_MARKER = "large"
"""The text that replaces a turn that hit the per-turn token cap (spec §2.4)."""

IMPERSONATION_SFT_PENALTY = 10.0

PAPER_SPECIAL_CASES: dict[str, object] = {
    "short_trajectory_tokens": None,
    "large_turn_penalty": False,
    "long_trajectory_tokens": None,
    "repeated_turn_zero_loss": False,
    "impersonation": "off",
    "normalizer_excludes_large": False,
}
"""The :class:`RewardConfig` values of the ``paper`` preset: every code-only special case off."""


def optima_reward(
    task_score: float,
    num_tokens: float,
    max_tokens: float,
    lm_loss: float,
    *,
    lambda_token: float,
    lambda_loss: float,
) -> float:
    """Eq. (1): ``task − λ_token·num_tokens/max_tokens + λ_loss/lm_loss``.

    >>> optima_reward(1.0, 50, 100, 2.0, lambda_token=0.6, lambda_loss=1.0)
    1.2
    """
    if not max_tokens > 0:
        raise ScoringError(f"max_tokens must be > 0 (the token normalizer), got {max_tokens!r}")
    if not lm_loss > 0:
        raise ScoringError(f"lm_loss must be > 0 (a mean cross-entropy), got {lm_loss!r}")
    return task_score - lambda_token * num_tokens / max_tokens + lambda_loss / lm_loss


@dataclass(frozen=True, slots=True, kw_only=True)
class RewardConfig:
    """Weights and the reference code's special cases (spec §3, §13 item 4).

    Use :meth:`preset` for the two faithful variants: ``code`` (every special case on, the
    default) and ``paper`` (Eq. 1 alone, the normalizer over all N samples).
    """

    lambda_token: float = 0.6
    """λ_token ≥ 0; the token term enters with a minus sign."""
    lambda_loss: float = 1.0
    """λ_loss ≥ 0; the readability term is ``λ_loss / lm_loss``."""
    short_trajectory_tokens: int | None = 40
    """Token term := −1 when the trajectory has at most this many tokens (``None``: off)."""
    large_turn_penalty: bool = True
    """Token term := −1 when a turn hit the per-turn cap (its text is the ``large`` marker)."""
    long_trajectory_tokens: int | None = 2000
    """Readability term := −1 when the trajectory has more tokens than this, or no turns."""
    repeated_turn_zero_loss: bool = True
    """Readability term := 0 when a turn repeats an earlier one (case-insensitive, prefix off)."""
    impersonation: Literal["sft", "mcts", "off"] = "sft"
    """A turn speaking for another agent: ``sft`` subtracts 10 from the total (iSFT data clean),
    ``mcts`` zeroes the task term (MCTS scoring), ``off`` ignores it."""
    normalizer_excludes_large: bool = True
    """Per-instance max normalizer ignores trajectories with a ``large`` turn (code iSFT)."""
    mcts_turn_scan: bool = True
    """With ``impersonation="mcts"``: the reference's tree-search reward reads the turns in order
    and stops at the first impersonating turn (task term 0, readability over the turns before it
    only, 0 when there are none) or at the first repeated turn (readability 0, task term kept); a
    trajectory over ``long_trajectory_tokens`` is not read (readability -1, task term kept).
    ``False``: any impersonating turn zeroes the task term, readability over every turn."""

    def __post_init__(self) -> None:
        for name in ("lambda_token", "lambda_loss"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0 or math.isnan(value):
                raise ScoringError(f"{name} must be a number >= 0, got {value!r}")
        if self.impersonation not in ("sft", "mcts", "off"):
            raise ScoringError(f"impersonation must be 'sft', 'mcts' or 'off', got {self.impersonation!r}")

    @classmethod
    def preset(cls, name: Literal["code", "paper"] = "code", **overrides: object) -> RewardConfig:
        """``code``: the reference implementation (default). ``paper``: Eq. 1 with no special case."""
        if name == "code":
            return cls(**overrides)  # type: ignore[arg-type]
        if name == "paper":
            return cls(**{**PAPER_SPECIAL_CASES, **overrides})  # type: ignore[arg-type]
        raise ScoringError(f"unknown reward preset {name!r}; expected 'code' or 'paper'")


def _strip_prefix(text: str, agents: Sequence[str]) -> str:
    stripped = text.strip()
    for agent in agents:
        if stripped.startswith(f"{agent}:"):
            return stripped[len(agent) + 1 :].strip()
    return stripped


def is_impersonating(turn: Turn, agents: Sequence[str]) -> bool:
    """A turn that writes another agent's ``"Name:"`` tag, or its own tag twice (spec §3)."""
    if turn.text.count(f"{turn.agent}:") > 1:
        return True
    return any(f"{other}:" in turn.text for other in agents if other != turn.agent)


def _has_repeat(turns: Sequence[Turn], agents: Sequence[str]) -> bool:
    seen: set[str] = set()
    for turn in turns:
        key = _strip_prefix(turn.text, agents).lower()
        if key in seen:
            return True
        seen.add(key)
    return False


def _scan(turns: Sequence[Turn], agents: Sequence[str], repeats: bool) -> tuple[int | None, bool]:
    """The reference tree-search reward's loop: (first impersonating turn, a repeat came first)."""
    seen: set[str] = set()
    for i, turn in enumerate(turns):
        if is_impersonating(turn, agents):
            return i, False
        key = _strip_prefix(turn.text, agents).lower()
        if repeats and key in seen:
            return None, True
        seen.add(key)
    return None, False


# size: Eq. 1 with each reference special case in the spec's order (spec §3); split, the order would hide
def score_episode(
    episode: Episode,
    *,
    config: RewardConfig,
    normalizer: float,
    turn_losses: Sequence[float] | None = None,
) -> RewardBreakdown:
    """The reward breakdown of one episode with a given token normalizer.

    Without a readability score (``episode.lm_loss is None``) the readability term is 0 and the
    flag ``no_readability`` says so; a non-positive normalizer raises :class:`ScoringError`.
    ``turn_losses`` (one per turn) lets ``mcts_turn_scan`` score the readability of the turns
    before an impersonating one; without them ``episode.lm_loss`` (every turn) is used.
    """
    if not normalizer > 0:
        raise ScoringError(f"token normalizer must be > 0, got {normalizer!r}")
    flags: list[str] = []
    turns, agents = episode.turns, episode.agents
    num_tokens = episode.num_tokens
    task = float(episode.task_score)
    lm_loss = episode.lm_loss
    long = config.long_trajectory_tokens is not None and (
        num_tokens > config.long_trajectory_tokens or not turns
    )

    scan = config.impersonation == "mcts" and config.mcts_turn_scan
    first: int | None = None
    repeat = False
    if scan:
        if not long:
            first, repeat = _scan(turns, agents, config.repeated_turn_zero_loss)
        impersonating = first is not None
        if impersonating and first:
            lm_loss = max(turn_losses[:first]) if turn_losses is not None else episode.lm_loss
    else:
        impersonating = config.impersonation != "off" and any(is_impersonating(t, agents) for t in turns)
        repeat = config.repeated_turn_zero_loss and _has_repeat(turns, agents)
    if impersonating and config.impersonation == "mcts":
        task = 0.0
        flags.append("impersonation_mcts")

    has_large = any(t.text == LARGE_TURN_MARKER for t in turns)
    if config.large_turn_penalty and has_large:
        token = -1.0
        flags.append("large_turn")
    elif config.short_trajectory_tokens is not None and num_tokens <= config.short_trajectory_tokens:
        token = -1.0
        flags.append("short_trajectory")
    else:
        token = -config.lambda_token * num_tokens / normalizer

    if long:
        readability = -1.0
        flags.append("long_trajectory" if turns else "no_turns")
    elif scan and first == 0:
        readability = 0.0  # the reference scores no turn before the impersonating one
        lm_loss = None
    elif repeat:
        readability = 0.0
        flags.append("repeated_turn")
    elif lm_loss is None:
        readability = 0.0
        flags.append("no_readability")
    elif not lm_loss > 0:
        raise ScoringError(f"lm_loss must be > 0, got {lm_loss!r} (episode {episode.sample_id})")
    else:
        readability = config.lambda_loss / lm_loss

    total = task + token + readability
    if impersonating and config.impersonation == "sft":
        total -= IMPERSONATION_SFT_PENALTY
        flags.append("impersonation_sft")
    return RewardBreakdown(
        task=task,
        token=token,
        readability=readability,
        total=total,
        num_tokens=num_tokens,
        normalizer=float(normalizer),
        lm_loss=lm_loss,
        flags=tuple(flags),
    )


def instance_max_normalizer(episodes: Sequence[Episode], *, config: RewardConfig) -> float:
    """Max #tokens over the group (ignoring ``large`` trajectories when the config says so).

    Falls back to 1 when nothing is left or the max is 0, so the term stays finite.
    """
    counts = [
        e.num_tokens
        for e in episodes
        if not (config.normalizer_excludes_large and any(t.text == LARGE_TURN_MARKER for t in e.turns))
    ]
    best = max(counts, default=0)
    return float(best) if best > 0 else 1.0


def score_group(
    episodes: Sequence[Episode], *, config: RewardConfig, normalizer: float | None = None
) -> list[Episode]:
    """Score the N samples of one instance; returns the episodes with ``reward`` filled in.

    Args:
        episodes: the samples of ONE instance (same ``sample_id``).
        config: weights and special cases.
        normalizer: a constant token normalizer (e.g. :func:`percentile_normalizer`), or ``None``
            for the per-instance max (paper; code iSFT).
    """
    ids = {e.sample_id for e in episodes}
    if len(ids) > 1:
        raise ScoringError(
            f"score_group scores the samples of one instance, got several sample ids: {sorted(ids)}; "
            "group the episodes by sample_id first"
        )
    norm = instance_max_normalizer(episodes, config=config) if normalizer is None else normalizer
    return [dataclasses.replace(e, reward=score_episode(e, config=config, normalizer=norm)) for e in episodes]


def percentile_normalizer(
    token_counts: Sequence[int], percentile: float = 85.0, *, rounding: Literal["int", "float"] = "int"
) -> float:
    """The MCTS token normalizer (spec §6.3): the given percentile of token counts, plus 1.

    ``rounding="int"`` (the reference: ``int(np.percentile(counts, p)) + 1``) truncates the
    percentile first; ``"float"`` keeps it as numpy interpolates it.

    >>> percentile_normalizer([10, 20, 30, 40, 45], 50), percentile_normalizer([10, 15], 50)
    (31.0, 13.0)
    >>> percentile_normalizer([10, 15], 50, rounding="float")
    13.5
    """
    import numpy as np

    if not len(token_counts):
        raise ScoringError("percentile_normalizer needs at least one token count, got none")
    if not 0 <= percentile <= 100:
        raise ScoringError(f"percentile must lie in [0, 100], got {percentile!r}")
    if rounding not in ("int", "float"):
        raise ScoringError(f"rounding must be 'int' or 'float', got {rounding!r}")
    value = float(np.percentile(np.asarray(token_counts, dtype=float), percentile))
    return float(int(value) + 1) if rounding == "int" else value + 1.0
