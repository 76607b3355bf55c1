"""The host's generation for sampled stages (iSFT and every SFT stage; spec §5), phase by phase.

1. ``generate``: N conversations (``generation.num_samples``) on each of the stage's draws (cursor
   positions: a stage that draws more instances than the split holds plays a row again as its own
   draw, with its own job key and sample id, :func:`~optima_trainers.sft.selection.draw_sample_id`),
   appended to ``episodes.jsonl`` as each ends and resumed like any rollout; the initialization
   samples with the format-diverse pool (when the task has one) at ``generation.init_temperature``;
2. ``score``: the run's one scorer (:class:`~optima_env.episode_scorer.EpisodeScorer`: the frozen
   base model's readability, the per-instance max token normalizer, the run's reward
   ``config.reward``, and the ``optima_episode_scored`` event), written atomically to
   ``scored.jsonl``. Under several processes each rank scores its own shard of the episodes (the
   jobs it played) with its own scorer into ``scored.rank<r>of<N>.jsonl`` (written at once), and
   the main process gathers them in job order (:func:`~optima_trainers.generation.shards.compute_shard`):
   the records one process writes, since an episode's score depends on that episode alone and on
   its instance's token normalizer, the max over all its samples (every rank reads every
   episode for it);
3. ``select``: the ``optima_select_training_data`` hook's choice, written atomically to
   ``selected.jsonl``.

:func:`read_sample_stage` reads the stage's data back for the ``optima_generation_end`` hook.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optima_env.episode_scorer import EpisodeScorer
from optima_env.errors import PluginError
from optima_env.io import read_episodes, write_episodes
from optima_env.rollout import RolloutJob, make_jobs
from optima_env.types import Episode
from optima_trainers.config.train import TrainConfig
from optima_trainers.generation.rollouts import GenerationContext, episode_summary, stage_rollout
from optima_trainers.generation.shards import compute_shard, discard_shards
from optima_trainers.sft.selection import draw_sample_id

__all__ = ["generate_sample_stage", "read_sample_stage", "select_through_hook"]


def generate_sample_stage(ctx: GenerationContext, *, indices: list[int], init: bool) -> None:
    """Run (or resume) the generate, score and select phases of one stage into ``ctx.folder``.

    ``indices`` are cursor positions (``position % ctx.num_train`` is the row played); ``init``
    marks the initialization (the format-diverse pool at ``generation.init_temperature``). Under
    several processes (``ctx.shard``) each rank plays its shard of the jobs and scores the same
    shard; the main process gathers both and selects alone; the other ranks return once their
    scored shard is on disk. One process is the case N = 1 of the same steps."""
    config, folder, shard = ctx.config, ctx.folder, ctx.shard
    scored_path, selected_path = folder / "scored.jsonl", folder / "selected.jsonl"
    if not scored_path.is_file():
        started = time.perf_counter()
        jobs = make_jobs(indices, config.generation.num_samples, ctx.seed)
        episodes = [_as_drawn(e, ctx.num_train) for e in _generate(ctx, jobs, init=init)]
        ctx.phase("generate", started, {"cursor": indices[0] if indices else 0})
        started = time.perf_counter()
        scored = compute_shard(
            shard,
            folder,
            scored_path.name,
            [(j.index, j.sample) for j in jobs],
            lambda positions: [e.to_dict() for e in _score(ctx, episodes, positions)],
            what="episodes to score",
        )
        if scored is None:  # another rank: its scored shard is on disk, the main process gathers
            return
        ctx.phase("score", started, {})
    if shard.main:  # the stage's files hold every rank's episodes and scores: the shards go
        discard_shards(folder, "episodes.jsonl", scored_path.name)
    if not selected_path.is_file() and shard.main:
        started = time.perf_counter()
        chosen = select_through_hook(ctx.events, ctx.stage.name, read_episodes(scored_path), config)
        write_episodes(selected_path, chosen)
        ctx.phase("select", started, {})


def _generate(ctx: GenerationContext, jobs: list[RolloutJob], *, init: bool) -> list[Episode]:
    """Every job's episode in job order (``episodes.jsonl``, appended and resumed); under several
    processes this rank plays its shard, and every rank gets every episode (the group normalizers
    need each instance's samples), the shard files left for :func:`generate_sample_stage`."""
    task, gen = ctx.task, ctx.config.generation
    diverse = init and gen.diverse_init and task.num_formats > 0
    return stage_rollout(
        ctx,
        "episodes.jsonl",
        jobs,
        sampling=gen.sampling(task.agents, seed=ctx.seed, init=init),
        diverse=diverse,
        everyone=True,
    )


def _score(ctx: GenerationContext, episodes: list[Episode], positions: list[int]) -> list[Episode]:
    """The episodes at ``positions`` scored with the run's reward and fired as scored, in order:
    their turns' readability from this process's scorer in one call (as one process scores every
    turn of a stage), each instance's token normalizer the max over all its ``episodes``."""
    scorer = EpisodeScorer(ctx.config.reward, readability=ctx.readability(), on_scored=ctx.on_scored)
    return scorer.score([episodes[p] for p in positions], group=episodes)


def read_sample_stage(folder: Path) -> tuple[list[Episode], list[Episode], dict[str, float]]:
    """``(scored episodes, selected episodes, metrics)`` of a generated sampled stage."""
    scored, selected = read_episodes(folder / "scored.jsonl"), read_episodes(folder / "selected.jsonl")
    metrics = {
        **episode_summary(scored),
        "select/instances": float(len({e.sample_id for e in scored})),
        "select/selected": float(len(selected)),
        "select/reward": _mean([e.reward.total for e in selected if e.reward is not None]),
        "select/task_score": _mean([e.task_score for e in selected]),
        "select/tokens": _mean([float(e.num_tokens) for e in selected]),
    }
    return scored, selected, metrics


def _as_drawn(episode: Episode, size: int) -> Episode:
    """The episode under its draw's sample id (its job's cursor position tells the cycle)."""
    import dataclasses

    drawn = draw_sample_id(episode.sample_id, int(episode.metadata["job"][0]), size)
    return episode if drawn == episode.sample_id else dataclasses.replace(episode, sample_id=drawn)


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def select_through_hook(
    events: Any, stage: str, scored: Sequence[Episode], config: TrainConfig
) -> list[Episode]:
    """The ``optima_select_training_data`` hook's choice among a stage's scored episodes (``events``:
    the run's hook relay, ``pm.hook``, with the trainer hookspecs added)."""
    chosen = events.optima_select_training_data(
        episodes=list(scored),
        trainer=config.trainer,
        config={**config.selection.to_dict(), "stage": stage, "task": config.task},
    )
    if chosen is None:
        raise PluginError(
            "no plugin answered optima_select_training_data; the built-in one "
            "(optima_trainers.backends.builtin) should: is it unregistered or blocked?"
        )
    if not all(isinstance(e, Episode) for e in chosen):
        raise PluginError("optima_select_training_data must return a list of Episode records")
    return list(chosen)
