"""The work of a run: its tasks (or why one is not evaluated) and its (method, task) units.

A unit is one (method, task, instance, sample) episode. :func:`pending_jobs` lists the units the
store does not hold yet and :func:`play` generates them with the batched engine, appending each
episode to the store as it ends, so a crash loses at most the episodes in flight.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.evaluation.methods import Method, PlaySettings
from benchmarks.evaluation.policies import load_policy
from benchmarks.evaluation.store import EpisodeStore
from benchmarks.evaluation.suite_spec import Suite
from optima_env import RewardConfig, make_task, resolve_task_id
from optima_env.backends.precision import MIXED, recorded_engine
from optima_env.configtree import apply
from optima_env.errors import (
    DataError,
    DataMissingError,
    MissingDependencyError,
    RunConfigError,
    UnknownTaskError,
)
from optima_env.policy import ChatPolicy
from optima_env.registry import task_specs
from optima_env.rollout import RolloutJob, make_jobs, rollout
from optima_env.task import Task

__all__ = ["TaskEntry", "check_engine", "episode_engine", "open_task", "pending_jobs", "play", "play_methods"]

logger = logging.getLogger("benchmarks.run")


@dataclass
class TaskEntry:
    """One task of the run: the task object and its instances, or why it is not evaluated."""

    task: str
    family: str = ""
    obj: Task | None = None
    instances: int = 0
    status: str = "ok"
    """``ok``, ``data missing``, ``unavailable`` (a missing extra) or ``not registered``."""
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    """The reward of its episodes: the task's own thresholds (``TaskSpec.reward``), then ``--set``."""
    reason: str = ""
    task_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The arguments its factory got (the suite's, a checkpoint's training run's, then ``--task-arg``)."""

    def miss(self, exc: Exception) -> None:
        """Mark the task as not evaluated because of ``exc``."""
        self.status = "unavailable" if isinstance(exc, MissingDependencyError) else "data missing"
        self.reason = str(exc)
        self.obj = None


def open_task(
    names: tuple[str, ...],
    *,
    explicit: bool,
    suite: Suite,
    split: str,
    episodes: int | None,
    pm: Any,
    task_kwargs: Mapping[str, Any] | None = None,
    reward: Mapping[str, Any] | None = None,
) -> TaskEntry:
    """Resolve and load one task of the run.

    Args:
        names: alternative names of the task; the first registered one is used.
        explicit: the user named the task (an unknown name then raises ``UnknownTaskError``);
            otherwise the suite did, and an unknown name is reported as ``not registered``.
        suite: gives the number of instances.
        split: the data split.
        episodes: ``--episodes`` (overrides the suite's number of instances).
        pm: the plugin manager.
        task_kwargs: keyword arguments of the task factory (e.g. ``{"style": "small"}``).
        reward: :class:`~optima_env.reward.RewardConfig` values (``--set reward.NAME=VALUE``),
            applied over the task's own thresholds.
    """
    task_id = None
    for name in names:
        try:
            task_id = resolve_task_id(name, pm)
            break
        except UnknownTaskError:
            if explicit:
                raise
    if task_id is None:
        return TaskEntry(task=names[0], status="not registered", reason=f"no task named {' / '.join(names)}")
    spec = task_specs(pm)[task_id]
    entry = TaskEntry(task=task_id, reward=apply(RewardConfig(), {**spec.reward, **dict(reward or {})}),
                      task_kwargs=dict(task_kwargs or {}))  # fmt: skip
    try:
        task = _make(task_id, pm, dict(task_kwargs or {}))
        entry.family = task.family
        samples = task.samples(split)
        if len(samples) == 0:
            raise DataMissingError(f"split {split!r} of {task_id} has no instances")
        entry.instances = suite.num_instances(family=task.family, available=len(samples), override=episodes)
        samples[entry.instances - 1]  # lazy loaders fail here, not halfway through a rollout
        entry.obj = task
    except (DataMissingError, MissingDependencyError) as exc:  # a malformed file stops the run
        entry.miss(exc)
    return entry


def _make(task_id: str, pm: Any, kwargs: dict[str, Any]) -> Any:
    """The task object; a factory argument it does not take is one clear error."""
    try:
        return make_task(task_id, pm=pm, **kwargs)
    except TypeError as exc:
        raise RunConfigError(
            f"{task_id}: the task factory refused the arguments {sorted(kwargs)} ({exc}); pass only "
            "the arguments its docstring lists (python -c \"import optima_env; "
            f"help(optima_env.make_task('{task_id}'))\")"
        ) from exc


def pending_jobs(method: Method, entry: TaskEntry, store: EpisodeStore, *, seed: int) -> list[RolloutJob]:
    """The jobs of (method, task) whose episodes the store does not hold."""
    if entry.obj is None:
        return []
    return [
        j
        for j in make_jobs(range(entry.instances), num_samples=method.samples, seed=seed)
        if (method.key, entry.task, j.index, j.sample) not in store
    ]


def episode_engine(policy: ChatPolicy, greedy: bool) -> dict[str, str] | None:
    """The engine record of ``policy``'s episodes (the transformers engine's precision and sampler,
    :func:`~optima_env.backends.precision.engine_record`); ``None`` for engines without one."""
    engine = getattr(policy, "engine", None)
    if not isinstance(engine, dict):
        return None
    return {**engine, "sampler": "greedy"} if greedy else dict(engine)


def check_engine(
    method: Method, entry: TaskEntry, store: EpisodeStore, policy: ChatPolicy, settings: PlaySettings
) -> None:
    """Refuse to add ``policy``'s episodes to a (method, task) whose stored episodes another engine
    generated (another precision or sampler: the same seeds give other episodes), so a store never
    mixes engines; an episode without a record was generated by the fp32 ``multinomial`` engine."""
    greedy = method.sampling(settings).greedy
    engine = episode_engine(policy, greedy)
    if engine is None:
        return
    for key, episode in store.items():
        if key[:2] != (method.key, entry.task):
            continue
        recorded = recorded_engine(episode.metadata, greedy=greedy)
        if recorded != engine:
            raise DataError(
                f"{store.path}: the stored episodes of {method.label} on {entry.task} were generated by "
                f"the engine {recorded}, this run's is {engine}; rerun with --precision "
                f"{recorded['precision']} to go on with theirs (a bf16 decode of mixed version {MIXED} only: "
                "this release decodes no other), or pass another --out"
            )
        return


# size: a play unit's options (task, method, model, sizes, store), forwarded from the run
def play(
    method: Method,
    entry: TaskEntry,
    jobs: list[RolloutJob],
    policy: ChatPolicy,
    tokenizer: Any,
    *,
    store: EpisodeStore,
    settings: PlaySettings,
    split: str,
    concurrency: int,
    model: str,
) -> None:
    """Generate ``jobs`` of (method, task), storing each episode with its unit key as it ends."""
    if entry.obj is None or not jobs:
        return
    engine = episode_engine(policy, method.sampling(settings).greedy)

    def keep(pos: int, episode: Any) -> None:
        job = jobs[pos]
        meta = {"method": method.key, "label": method.label, "instance": job.index, "sample": job.sample}
        if engine is not None:
            meta["engine"] = engine
        store.add(dataclasses.replace(episode, metadata={**episode.metadata, **meta, "model": model}))

    rollout(
        method.play_task(entry.obj),
        policy,
        jobs=jobs,
        sampling=method.sampling(settings),
        concurrency=concurrency,
        env_kwargs=dict(
            split=split,
            max_turns=method.max_turns(settings),
            tokenizer=tokenizer,
            reward_config=entry.reward,
        ),
        on_episode=keep,
        progress=True,
        stop_at_speaker_tags=settings.stop_at_speaker_tags,
    )


# size: the methods' shared options, forwarded from the run
def play_methods(
    methods: Sequence[Method],
    entries: Sequence[TaskEntry],
    store: EpisodeStore,
    *,
    settings: PlaySettings,
    split: str,
    concurrency: int,
    backend: str,
    default_model: str,
    policy_options: Mapping[str, Any] | None = None,
) -> None:
    """Generate every pending (method, task) unit, loading each model once and only if needed.

    A lazily loaded row that is missing or malformed marks its task ``data missing`` (the run goes
    on); a policy with a ``close`` method (a vLLM engine) is closed once its methods are done.
    ``policy_options`` go to :func:`~benchmarks.evaluation.policies.load_policy` (``base_urls``, ...).
    """
    for model in dict.fromkeys(m.model or default_model for m in methods):
        policy = tokenizer = None
        for method in (m for m in methods if (m.model or default_model) == model):
            for entry in entries:
                jobs = pending_jobs(method, entry, store, seed=settings.seed)
                if not jobs:
                    continue
                if policy is None:  # loaded only when something is left to generate
                    policy, tokenizer = load_policy(
                        model, backend=backend, batch_size=concurrency, **dict(policy_options or {})
                    )
                check_engine(method, entry, store, policy, settings)
                logger.info("%s on %s: %d episodes to generate", method.label, entry.task, len(jobs))
                try:
                    play(
                        method, entry, jobs, policy, tokenizer, store=store, settings=settings,
                        split=split, concurrency=concurrency, model=model,
                    )  # fmt: skip
                except DataMissingError as exc:  # a malformed row stops the run
                    entry.miss(exc)
        close = getattr(policy, "close", None)
        if callable(close):
            close()
        del policy, tokenizer
