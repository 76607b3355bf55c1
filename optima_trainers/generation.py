"""Generation and scoring for the trainer loop: resumable rollouts, readability and rewards.

:func:`resumable_rollout` appends every finished episode to a JSONL file as it ends, tagged with
its job (``metadata["job"] = [instance, sample]``). Called again on the same file (after a crash),
it reloads the finished episodes, rewrites the file without a torn last line, and plays only the
missing jobs. Because every request is sampled from its own seed
(:func:`optima_env.backends.loading.load_policy`) and job
seeds depend only on ``(seed, instance, sample)``, the result equals an uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from optima_env.configtree import ConfigError
from optima_env.errors import DataError
from optima_env.io import append_jsonl, read_episodes, write_episodes
from optima_env.policy import ChatPolicy, SamplingParams
from optima_env.readability import episode_lm_losses
from optima_env.registry import readability_specs
from optima_env.reward import RewardConfig, score_group
from optima_env.rollout import RolloutJob, rollout
from optima_env.task import Task
from optima_env.types import Episode
from optima_trainers.faults import fault_point

__all__ = [
    "episode_summary",
    "load_readability_scorer",
    "resumable_rollout",
    "score_episodes",
    "with_readability",
]

logger = logging.getLogger(__name__)


def _job_of(episode: Episode) -> tuple[int, int]:
    job = episode.metadata.get("job")
    if not (isinstance(job, (list, tuple)) and len(job) == 2):
        raise DataError(
            f"episode {episode.sample_id} in a resumable episodes file has no metadata['job']; "
            "the file was not written by optima_trainers; delete it to regenerate"
        )
    return int(job[0]), int(job[1])


def resumable_rollout(
    task: Task,
    policy: ChatPolicy,
    *,
    jobs: Sequence[RolloutJob],
    path: str | os.PathLike[str],
    sampling: SamplingParams,
    env_kwargs: Mapping[str, Any],
    concurrency: int,
    progress: bool = True,
    reset_options: Callable[[RolloutJob], Mapping[str, Any]] | None = None,
) -> list[Episode]:
    """Play ``jobs``, appending each episode to ``path``; resume from what ``path`` already holds.

    Returns:
        One episode per job, in job order.
    """
    path = Path(path)
    wanted = {(j.index, j.sample): j for j in jobs}
    done: dict[tuple[int, int], Episode] = {}
    if path.exists():
        for episode in read_episodes(path):
            key = _job_of(episode)
            if key not in wanted:
                raise DataError(
                    f"{path}: episode of job {key} is not one of this stage's jobs; delete the file"
                )
            if key in done:
                raise DataError(f"{path}: job {key} appears twice; the file is corrupt, delete it")
            done[key] = episode
        write_episodes(path, list(done.values()))  # drops a torn last line before appending again
        if done:
            logger.info("%s: reusing %d finished episodes of %d", path, len(done), len(jobs))
    remaining = [j for j in jobs if (j.index, j.sample) not in done]

    def on_episode(pos: int, episode: Episode) -> None:
        job = remaining[pos]
        tagged = dataclasses.replace(episode, metadata={**episode.metadata, "job": [job.index, job.sample]})
        append_jsonl(path, [tagged.to_dict()])
        done[(job.index, job.sample)] = tagged
        fault_point("episode")

    if remaining:
        rollout(
            task,
            policy,
            jobs=remaining,
            sampling=sampling,
            concurrency=concurrency,
            env_kwargs=env_kwargs,
            on_episode=on_episode,
            progress=progress,
            reset_options=reset_options,
        )
    path.touch()
    return [done[(j.index, j.sample)] for j in jobs]


def with_readability(
    episodes: Sequence[Episode], scorer: Callable[[Sequence[str]], Sequence[float]]
) -> list[Episode]:
    """Set ``lm_loss`` (max per-turn loss of the frozen base model), every turn scored in one call."""
    losses = episode_lm_losses(scorer, [[t.text for t in e.turns] for e in episodes])
    return [dataclasses.replace(e, lm_loss=loss) for e, loss in zip(episodes, losses)]


def score_episodes(
    episodes: Sequence[Episode], *, config: RewardConfig, normalizer: float | None = None
) -> list[Episode]:
    """Rewards per instance group (per-instance max normalizer, or a constant one), input order kept."""
    groups: dict[str, list[int]] = {}
    for i, episode in enumerate(episodes):
        groups.setdefault(episode.sample_id, []).append(i)
    out: list[Episode | None] = [None] * len(episodes)
    for positions in groups.values():
        scored = score_group([episodes[i] for i in positions], config=config, normalizer=normalizer)
        for i, episode in zip(positions, scored):
            out[i] = episode
    return [e for e in out if e is not None]


def episode_summary(episodes: Sequence[Episode]) -> dict[str, float]:
    """Mean reward (and its terms), task score, tokens (in all and per agent) and turns of a set of
    scored episodes, with namespaced names (``rollout/tokens/Alice``, ``reward/readability``)."""
    n = max(1, len(episodes))
    rewards = [e.reward for e in episodes if e.reward is not None]
    agents = dict.fromkeys(a for e in episodes for a in e.agents)
    return {
        "rollout/episodes": float(len(episodes)),
        "rollout/task_score": sum(e.task_score for e in episodes) / n,
        "rollout/tokens": sum(e.num_tokens for e in episodes) / n,
        "rollout/turns": sum(len(e.turns) for e in episodes) / n,
        **{
            f"rollout/tokens/{agent}": sum(
                t.num_tokens for e in episodes for t in e.turns if t.agent == agent
            )
            / n
            for agent in agents
        },
        **{
            f"reward/{term}": sum(getattr(r, term) for r in rewards) / max(1, len(rewards))
            for term in ("total", "task", "token", "readability")
        },
    }


def load_readability_scorer(config: Any, pm: Any) -> Any:
    """The registered readability scorer ``config.readability_scorer`` on the frozen base model
    (``readability_model``, default ``model``)."""
    specs = readability_specs(pm)
    name = config.readability_scorer
    if name not in specs:
        raise ConfigError(f"no readability scorer {name!r}; registered: {', '.join(specs) or '(none)'}")
    return specs[name].factory(config.readability_model or config.model, dtype=config.dtype)
