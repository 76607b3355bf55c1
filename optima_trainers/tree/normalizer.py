"""The MCTS token normalizer (spec §6.3): :func:`token_normalizer` of fresh conversations, and
:func:`estimate_token_normalizer`, which plays them.

The tree stage (:mod:`optima_trainers.generation.tree_stage`) plays the same conversations
resumably and takes their normalizer from :func:`token_normalizer` too.

Tree rollouts are scored by the one episode scorer (:class:`optima_env.episode_scorer.EpisodeScorer`
with the tree reward, ``TrainConfig.tree_reward``, and this normalizer, or ``normalizer="running"``
for the paper's per-instance max).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from optima_env.policy import ChatPolicy, SamplingParams
from optima_env.reward import percentile_normalizer
from optima_env.rollout import make_jobs, rollout
from optima_env.task import Task
from optima_env.types import Episode

__all__ = ["estimate_token_normalizer", "token_normalizer"]


def token_normalizer(
    episodes: Sequence[Episode], *, percentile: float = 85.0, rounding: Literal["int", "float"] = "int"
) -> float:
    """The ``percentile`` of the episodes' token counts plus 1 (85 for iDPO, 80 for iSFT-DPO), as
    ``int(percentile) + 1`` (``rounding="int"``, the reference) or unrounded (``"float"``)."""
    return percentile_normalizer([e.num_tokens for e in episodes], percentile, rounding=rounding)


# size: a rollout's options plus the percentile settings, keyword arguments with defaults
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
    then their :func:`token_normalizer`.

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
    return token_normalizer(episodes, percentile=percentile, rounding=rounding), episodes
