"""Generation and scoring for the trainer loop: resumable rollouts, readability and rewards.

:func:`stage_rollout` plays a stage's jobs into one of its files (its conversations, or the tree
stage's normalizer conversations), sharded over the run's processes and resumable.
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
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

from optima_env.configtree import ConfigError
from optima_env.errors import DataError
from optima_env.io import append_jsonl, read_episodes, write_episodes
from optima_env.policy import ChatPolicy, SamplingParams, TurnEngine
from optima_env.registry import readability_specs
from optima_env.rollout import RolloutJob, rollout
from optima_env.task import Task
from optima_env.types import Episode
from optima_trainers.config.env import EnvSettings
from optima_trainers.generation.shards import (
    Shard,
    collect,
    discard_shards,
    fold,
    play_shard,
    write_gathered,
)
from optima_trainers.run.faults import fault_point
from optima_trainers.run.stages import Stage

__all__ = [
    "GenerationContext",
    "PhaseClock",
    "episode_summary",
    "in_flight",
    "load_readability_scorer",
    "resumable_rollout",
    "stage_rollout",
]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GenerationContext:
    """What the host's stage generators (:mod:`~optima_trainers.generation.samples`,
    :mod:`~optima_trainers.generation.tree_stage`) need from the run, in one object instead of
    parameter lists."""

    task: Task
    """The run's task."""
    config: Any
    """The run's :class:`~optima_trainers.config.train.TrainConfig`."""
    stage: Stage
    """The stage being generated."""
    folder: Path
    """The stage folder (every phase's output goes there, appended or written atomically)."""
    seed: int
    """The stage's seed (:func:`~optima_trainers.run.stages.stage_seed`)."""
    num_train: int
    """Rows of the training split: a cursor position ``p`` plays row ``p % num_train``."""
    load_policy: Callable[[], ChatPolicy]
    """The current model's policy (loaded when a phase needs it)."""
    release: Callable[[ChatPolicy], None]
    """Frees a policy once its phase is over."""
    env: Callable[..., EnvSettings]
    """``env(policy, diverse=False)``: the run's env settings for that policy."""
    readability: Callable[[], Callable[[Sequence[str]], Sequence[float]]]
    """The frozen base model's per-turn losses (loaded on first call, once per run)."""
    events: Any
    """The run's hook relay: ``optima_episode_scored``, ``optima_select_training_data``."""
    phase: Callable[[str, float, dict[str, Any]], None]
    """Records a finished phase (name, start time, extra values) in the run state."""
    record_time: Callable[[str, float], None] = lambda phase, seconds: None
    """Adds seconds to a phase that has not finished (name, seconds) in the run state
    (:class:`PhaseClock`); nothing by default and on the processes that record no phases."""
    progress: bool = False
    """Show progress bars."""
    shard: Shard = dataclasses.field(default_factory=Shard)
    """This process's part of the stage's jobs (:mod:`~optima_trainers.generation.shards`; all of them in
    one process)."""

    def on_scored(self, episode: Episode) -> None:
        """Fire ``optima_episode_scored`` for one episode of this stage."""
        self.events.optima_episode_scored(episode=episode, stage=self.stage)


logger = logging.getLogger(__name__)


def in_flight(generation: Any, policy: ChatPolicy) -> int | None:
    """The conversations in flight of every rollout the trainer makes with ``policy``:
    ``generation.concurrency`` when set; else ``None`` (:func:`~optima_env.rollout.rollout` sizes
    it from the engine's ``capacity``: the transformers engine's batch slots, vLLM's
    ``max_num_seqs``, the servers' client's conversations per server) for a turn
    engine or a policy declaring a ``capacity``, or ``generation.batch_size`` for a policy
    declaring none (the transformers path for models outside its fast path): as many
    conversations as its batch holds."""
    if generation.concurrency is not None:
        return generation.concurrency
    capacity = getattr(policy, "capacity", None)
    if isinstance(policy, TurnEngine) or (isinstance(capacity, int) and not isinstance(capacity, bool)):
        return None
    return generation.batch_size


def _job_of(episode: Episode) -> tuple[int, int]:
    job = episode.metadata.get("job")
    if not (isinstance(job, (list, tuple)) and len(job) == 2):
        raise DataError(
            f"episode {episode.sample_id} in a resumable episodes file has no metadata['job']; "
            "the file was not written by optima_trainers; delete it to regenerate"
        )
    return int(job[0]), int(job[1])


# size: the rollout driver's options plus the resume file; forwarded to rollout()
def resumable_rollout(
    task: Task,
    policy: ChatPolicy,
    *,
    jobs: Sequence[RolloutJob],
    path: str | os.PathLike[str],
    sampling: SamplingParams,
    env_kwargs: Mapping[str, Any],
    concurrency: int | None = None,
    driver: str = "auto",
    progress: bool = True,
    reset_options: Callable[[RolloutJob], Mapping[str, Any]] | None = None,
    reused: Mapping[tuple[int, int], Episode] | None = None,
) -> list[Episode]:
    """Play ``jobs``, appending each episode to ``path``; resume from what ``path`` already holds.
    Jobs in ``reused`` (by ``(instance, sample)``: finished in another file, e.g. the stage's
    gathered file beside a rank's shard file) are neither played nor written here.
    ``concurrency`` and ``driver`` go to :func:`~optima_env.rollout.rollout` as they are
    (``generation.concurrency``, ``None``: the engine's capacity; ``generation.driver``).

    Returns:
        One episode per job, in job order.
    """
    reused = dict(reused or {})
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
    remaining = [j for j in jobs if (j.index, j.sample) not in done and (j.index, j.sample) not in reused]

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
            driver=driver,
            env_kwargs=env_kwargs,
            on_episode=on_episode,
            progress=progress,
            reset_options=reset_options,
        )
    path.touch()
    keys = [(j.index, j.sample) for j in jobs]
    return [done[k] if k in done else reused[k] for k in keys]


@overload
def stage_rollout(
    ctx: GenerationContext,
    name: str,
    jobs: list[RolloutJob],
    *,
    sampling: SamplingParams,
    diverse: bool = ...,
    policy: ChatPolicy | None = ...,
    everyone: Literal[True],
    what: str = ...,
) -> list[Episode]: ...
@overload
def stage_rollout(
    ctx: GenerationContext,
    name: str,
    jobs: list[RolloutJob],
    *,
    sampling: SamplingParams,
    diverse: bool = ...,
    policy: ChatPolicy | None = ...,
    everyone: Literal[False] = ...,
    what: str = ...,
) -> list[Episode] | None: ...
def stage_rollout(
    ctx: GenerationContext,
    name: str,
    jobs: list[RolloutJob],
    *,
    sampling: SamplingParams,
    diverse: bool = False,
    policy: ChatPolicy | None = None,
    everyone: bool = False,
    what: str = "jobs",
) -> list[Episode] | None:
    """Play ``jobs`` into the stage file ``name`` (:func:`resumable_rollout`: appended, resumed),
    row ``job.index % ctx.num_train`` each, and return every job's episode in job order.

    ``policy``: the policy to play with; ``None`` loads one (``ctx.load_policy``) where there is
    something to play and releases it after. The env: ``ctx.env(policy, diverse=diverse)``.
    Under several processes (``ctx.shard``) each rank plays its shard (``what`` names the jobs in
    its log line and marker); the main process gathers them into ``name``. With ``everyone``
    every rank waits for all and gets every episode, and the shard files stay for the stage's
    other phases to remove; otherwise the main process removes them and the others get ``None``.
    """
    gen, shard, folder = ctx.config.generation, ctx.shard, ctx.folder

    def play(todo: list[RolloutJob], path: Path, reused: Mapping[tuple[int, int], Episode]) -> list[Episode]:
        active = policy if policy is not None else ctx.load_policy()
        episodes = resumable_rollout(
            ctx.task,
            active,
            jobs=todo,
            reset_options=lambda job: {"index": job.index % ctx.num_train},
            path=path,
            sampling=sampling,
            env_kwargs=ctx.env(active, diverse=diverse).kwargs(gen, split=ctx.config.split),
            concurrency=in_flight(gen, active),
            driver=gen.driver,
            progress=ctx.progress,
            reused=reused,
        )
        if policy is None:
            ctx.release(active)
        return episodes

    keys = [(j.index, j.sample) for j in jobs]
    if shard.world == 1:
        fold(folder, name, keys)  # the shards of an earlier multi-process attempt, if any
        return play(jobs, folder / name, {})
    play_shard(shard, folder, name, keys, lambda positions, path, reused: play(
        [jobs[p] for p in positions], path, {k: Episode.from_dict(r) for k, r in reused.items()}
    ), what=what)  # fmt: skip
    if not (shard.main or everyone):
        return None
    records = [record for _, record in collect(shard, folder, name, keys)]
    if shard.main:
        write_gathered(folder, name, records)
        if not everyone:
            discard_shards(folder, name)
    return [Episode.from_dict(record) for record in records]


class PhaseClock:
    """A long phase's wall time, recorded as its work is saved, not only when it ends.

    A tree phase runs for hours and saves each tree as it completes; a run stopped in the middle
    resumes from the saved trees, so the time that grew them counts toward the run's result, in
    whichever invocation it was spent. :meth:`lap` adds the time since the last lap (or the start) to the
    phase's timing without marking it finished (``ctx.record_time``); :meth:`finish` records the
    rest and marks the phase finished (``ctx.phase``). Time after the last lap of an interrupted
    invocation is lost with the work in flight, which the resumed phase does again.
    """

    __slots__ = ("ctx", "last", "name")

    def __init__(self, ctx: GenerationContext, name: str) -> None:
        self.ctx = ctx
        self.name = name
        self.last = time.perf_counter()

    def lap(self) -> None:
        """Record the time since the last lap: work up to now is saved."""
        now = time.perf_counter()
        self.ctx.record_time(self.name, now - self.last)
        self.last = now

    def finish(self, extra: Mapping[str, Any] | None = None) -> None:
        """Record the time since the last lap and mark the phase finished."""
        self.ctx.phase(self.name, self.last, dict(extra or {}))


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
    spec = check_readability_scorer(config, pm)
    return spec.factory(config.readability_model or config.model, dtype=config.dtype)


def check_readability_scorer(config: Any, pm: Any) -> Any:
    """The registered spec of ``config.readability_scorer``; a name no plugin registers is refused
    when the run is built, not when its first stage scores."""
    specs = readability_specs(pm)
    name = config.readability_scorer
    if name not in specs:
        raise ConfigError(
            f"readability_scorer: expected one of {', '.join(map(repr, specs)) or '(none registered)'}, "
            f"got {name!r}; set --set readability_scorer=transformers, or install the plugin that "
            f"registers {name!r}"
        )
    return specs[name]
