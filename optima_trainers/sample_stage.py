"""The host's generation for sampled stages (iSFT and every SFT stage; spec §5), phase by phase.

1. ``generate``: N conversations (``generation.num_samples``) on each of the stage's draws (cursor
   positions: a stage that draws more instances than the split holds plays a row again as its own
   draw, with its own job key and sample id, :func:`~optima_trainers.selection.draw_sample_id`),
   appended to ``episodes.jsonl`` as each ends and resumed like any rollout; the initialization
   samples with the format-diverse pool (when the task has one) at ``generation.init_temperature``;
2. ``score``: the frozen base model's readability and the run's reward (``config.reward``, the
   per-instance max token normalizer), written atomically to ``scored.jsonl``; every scored
   episode goes to ``on_scored`` (the ``optima_episode_scored`` hook);
3. ``select``: the selection hook's choice, written atomically to ``selected.jsonl``.

:func:`read_sample_stage` reads the stage's data back for the ``optima_generation_end`` hook.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from optima_env.errors import PluginError
from optima_env.io import read_episodes, write_episodes
from optima_env.policy import SamplingParams
from optima_env.rollout import make_jobs
from optima_env.task import Task
from optima_env.types import Episode
from optima_trainers.config import TrainConfig
from optima_trainers.generation import episode_summary, resumable_rollout, score_episodes, with_readability
from optima_trainers.selection import draw_sample_id

__all__ = ["generate_sample_stage", "read_sample_stage", "select_through_hook"]


def generate_sample_stage(
    *,
    task: Task,
    policy_factory: Callable[[], Any],
    release: Callable[[Any], None],
    config: TrainConfig,
    folder: Path,
    seed: int,
    indices: list[int],
    init: bool,
    readability: Callable[[], Any],
    env_kwargs: Callable[..., dict[str, Any]],
    stops: tuple[str, ...],
    on_scored: Callable[[Episode], None],
    select: Callable[[Sequence[Episode]], list[Episode]],
    on_phase: Callable[[str, float, dict[str, Any]], None],
    progress: bool,
    num_train: int | None = None,
) -> None:
    """Run (or resume) the generate, score and select phases of one stage into ``folder``.

    ``indices`` are cursor positions (``position % num_train`` is the row played; without
    ``num_train`` they must be row indices of the split)."""
    gen = config.generation
    size = num_train or len(task.samples(config.split))
    scored_path, selected_path = folder / "scored.jsonl", folder / "selected.jsonl"
    if not scored_path.is_file():
        started = time.perf_counter()
        policy = policy_factory()
        diverse = init and gen.diverse_init and task.num_formats > 0
        episodes = resumable_rollout(
            task,
            policy,
            jobs=make_jobs(indices, gen.num_samples, seed),
            reset_options=lambda job: {"index": job.index % size},
            path=folder / "episodes.jsonl",
            sampling=SamplingParams(
                temperature=gen.init_temperature if init else gen.temperature,
                top_p=gen.top_p,
                max_new_tokens=gen.max_new_tokens,
                seed=seed,
                stop=stops,
            ),
            env_kwargs=env_kwargs(policy, diverse=diverse),
            concurrency=gen.concurrency,
            progress=progress,
        )
        release(policy)
        episodes = [_as_drawn(e, size) for e in episodes]
        on_phase("generate", started, {"cursor": indices[0] if indices else 0})
        started = time.perf_counter()
        scored = score_episodes(with_readability(episodes, readability()), config=config.reward)
        write_episodes(scored_path, scored)
        for episode in scored:
            on_scored(episode)
        on_phase("score", started, {})
    if not selected_path.is_file():
        started = time.perf_counter()
        write_episodes(selected_path, select(read_episodes(scored_path)))
        on_phase("select", started, {})


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


def select_through_hook(pm: Any, stage: str, scored: Sequence[Episode], config: TrainConfig) -> list[Episode]:
    """The ``optima_select_training_data`` hook's choice among a stage's scored episodes."""
    from optima_trainers.hookspecs import add_trainer_hookspecs

    chosen = add_trainer_hookspecs(pm).hook.optima_select_training_data(
        episodes=list(scored),
        trainer=config.trainer,
        config={**config.selection.to_dict(), "stage": stage, "task": config.task},
    )
    if chosen is None:
        raise PluginError(
            "no plugin answered optima_select_training_data; the built-in one "
            "(optima_trainers.plugin) should: is it unregistered or blocked?"
        )
    if not all(isinstance(e, Episode) for e in chosen):
        raise PluginError("optima_select_training_data must return a list of Episode records")
    return list(chosen)
