"""Play conversations with a policy: one at a time, or many at once in batches.

:func:`rollout` keeps up to ``concurrency`` episodes in flight. At every step it gathers the
prompt of each running episode's current speaker, sends them to the policy as ONE batch, steps
each env with its reply, and refills finished slots from the queue, so the backend always sees a
full batch. Episodes come back in job order (instance by instance, sample by sample) whatever the
order they finished in, and each job's seed is a pure function of ``(seed, instance, sample)``:
with a scripted policy the result equals playing the jobs one by one with :func:`run_episode`.

Work that depends on finished episodes can join the same loop: ``refill`` is called after every
step in which episodes ended, and the jobs it returns are queued behind the others (a tree search
enqueues a tree's next rollouts as soon as its last ones end, so the batch stays full across
trees). A refilled job's position is the next free one: the given jobs are ``0 .. len(jobs) - 1``,
then the refilled ones in the order they were returned.

How the batch is served is the backend's business: transformers generates it as padded batches
(with a KV cache reused across turns), vLLM schedules it with continuous batching, and the
OpenAI-compatible client sends it as concurrent HTTP requests.

Failures: when the policy raises (an HTTP backend gives up after its retries, a model runs out of
memory, ...), :func:`rollout` raises :class:`RolloutError`, a
:class:`~optima_env.errors.BackendError` that keeps every episode finished so far
(``err.finished``, by job position; they were also passed to ``on_episode``) and lists the jobs
still to play (``err.pending``), so a caller can save the work and resume with
``jobs=[jobs[i] for i in err.pending]`` (``err.jobs`` lists every job by position, the refilled
ones included; a resumed call gets no refill for what it replays unless it passes one again).
"""

from __future__ import annotations

import dataclasses
import sys
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optima_env.conversation_env import ConversationEnv
from optima_env.errors import RolloutError, TaskContractError
from optima_env.policy import ChatPolicy, GenerationRequest, SamplingParams, speaker_stops
from optima_env.task import Task
from optima_env.types import Episode

__all__ = ["RolloutError", "RolloutJob", "job_seed", "make_jobs", "rollout", "run_episode"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutJob:
    """One episode to play: instance ``index`` of the split, sample number ``sample``."""

    index: int
    sample: int
    seed: int


def job_seed(seed: int, index: int, sample: int) -> int:
    """A stable 31-bit seed for one (instance, sample) pair.

    >>> job_seed(0, 1, 2) == job_seed(0, 1, 2) != job_seed(0, 1, 3)
    True
    """
    return zlib.crc32(f"{seed}/{index}/{sample}".encode()) & 0x7FFFFFFF


def make_jobs(instances: Sequence[int], num_samples: int, seed: int) -> list[RolloutJob]:
    """``num_samples`` jobs per instance, instance-major."""
    if num_samples < 1:
        raise TaskContractError(f"num_samples must be >= 1, got {num_samples!r}")
    return [
        RolloutJob(index=i, sample=k, seed=job_seed(seed, i, k))
        for i in instances
        for k in range(num_samples)
    ]


def _request(env: ConversationEnv, key: tuple[object, ...]) -> GenerationRequest:
    agent = env.agent_selection
    return GenerationRequest(
        messages=env.chat_messages(agent), prefix=env.reply_prefix(agent), agent=agent, key=key
    )


def run_episode(
    env: ConversationEnv,
    policy: ChatPolicy,
    *,
    seed: int | None,
    sampling: SamplingParams | None = None,
    options: Mapping[str, Any] | None = None,
) -> Episode:
    """Play one episode to its end, one ``generate`` call per turn; returns its record."""
    sampling = sampling or SamplingParams()
    env.reset(seed=seed, options=options)
    while env.episode is None:
        request = _request(env, (seed, len(env.turns)))
        (reply,) = _checked_replies(policy, policy.generate([request], sampling), 1, {}, [0], ())
        env.step(reply)
    return env.episode


# size: the rollout driver's public API: jobs, sampling and keyword options with defaults
def rollout(
    task: Task,
    policy: ChatPolicy,
    *,
    jobs: Sequence[RolloutJob],
    sampling: SamplingParams | None = None,
    concurrency: int = 32,
    env_kwargs: Mapping[str, Any] | None = None,
    on_episode: Callable[[int, Episode], None] | None = None,
    progress: bool | None = None,
    reset_options: Callable[[RolloutJob], Mapping[str, Any]] | None = None,
    stop_at_speaker_tags: bool = False,
    request_key: Callable[[RolloutJob, int], tuple[object, ...]] | None = None,
    refill: Callable[[Sequence[tuple[int, Episode]]], Sequence[RolloutJob]] | None = None,
) -> list[Episode]:
    """Play every job, ``concurrency`` at a time, batching all pending turns per step.

    Args:
        task: the task to play (shared by every env; its data is loaded once).
        policy: the generation backend.
        jobs: what to play (see :func:`make_jobs`).
        sampling: sampling parameters for every turn.
        concurrency: episodes in flight (the policy's batch size per step, at most).
        env_kwargs: keyword arguments of :class:`ConversationEnv` (``split``, ``tokenizer``, ...).
        on_episode: called with ``(job position, episode)`` as each episode finishes, e.g. to
            append it to a results file.
        progress: show a tqdm progress bar (``None``, the default: when stderr is a terminal, so
            an interactive rollout shows its progress and a log or a test stays quiet).
        reset_options: extra ``reset`` options per job (default: ``{"index": job.index}``).
        stop_at_speaker_tags: end a turn where the speaker starts writing an agent's ``"Name:"``
            tag (impersonation, spec §3) instead of generating it; off by default, as in the
            reference code, which lets the reward penalize it.
        request_key: the key of a job's request at a given turn, from which seeded backends
            derive its sampling seed (default ``(job.seed, turn)``); jobs that share an env seed
            (the rollouts of one MCTS tree see the same evidence) need distinct keys to differ.
        refill: called after each generation step in which episodes ended, with their
            ``(position, episode)`` in position order (after ``on_episode`` saw each); the jobs it
            returns are queued behind the pending ones and played in the same loop, taking the
            positions ``len(jobs), len(jobs) + 1, ...`` in the order they were returned. Jobs that
            depend on finished episodes (a tree's next rollouts) thus keep the batch full.

    Returns:
        The episodes, in the order of ``jobs``, then those of the refilled jobs in position order.

    Raises:
        RolloutError: the policy failed; the error carries the episodes finished before it.
    """
    if concurrency < 1:
        raise TaskContractError(f"concurrency must be >= 1, got {concurrency!r}")
    sampling = sampling or SamplingParams()
    if stop_at_speaker_tags:
        extra = tuple(s for s in speaker_stops(task.agents) if s not in sampling.stop)
        sampling = dataclasses.replace(sampling, stop=sampling.stop + extra)
    env_kwargs = dict(env_kwargs or {})
    jobs = list(jobs)  # grows with the refilled jobs: position -> job
    queue = deque(enumerate(jobs))
    finished: dict[int, Episode] = {}
    active: list[tuple[int, RolloutJob, ConversationEnv]] = []
    bar = None
    if progress is None:
        progress = sys.stderr.isatty()
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc=f"rollout {task.id}", unit="ep")
    try:
        while queue or active:
            while queue and len(active) < concurrency:
                pos, job = queue.popleft()
                env = ConversationEnv(task, **env_kwargs)
                options = dict(reset_options(job)) if reset_options else {"index": job.index}
                env.reset(seed=job.seed, options=options)
                active.append((pos, job, env))
            requests = [
                _request(env, request_key(job, len(env.turns)) if request_key else (job.seed, len(env.turns)))
                for _, job, env in active
            ]
            replies = _generate(policy, requests, sampling, finished, jobs)
            still: list[tuple[int, RolloutJob, ConversationEnv]] = []
            ended: list[tuple[int, Episode]] = []
            for (pos, job, env), reply in zip(active, replies):
                env.step(reply)
                if env.episode is None:
                    still.append((pos, job, env))
                    continue
                finished[pos] = env.episode
                ended.append((pos, env.episode))
                if on_episode is not None:
                    on_episode(pos, env.episode)
                if bar is not None:
                    bar.update(1)
            active = still
            if refill is not None and ended:
                added = _checked_jobs(refill(ended))
                queue.extend(enumerate(added, start=len(jobs)))
                jobs.extend(added)
                if bar is not None and added:
                    bar.total += len(added)
                    bar.refresh()
    finally:
        if bar is not None:
            bar.close()
    return [finished[pos] for pos in range(len(jobs))]


def _checked_jobs(added: object) -> list[RolloutJob]:
    """What ``refill`` returned, checked: a sequence of :class:`RolloutJob`."""
    if not isinstance(added, Sequence) or not all(isinstance(j, RolloutJob) for j in added):
        raise TaskContractError(f"refill must return a sequence of RolloutJob, got {added!r}")
    return list(added)


def _generate(
    policy: ChatPolicy,
    requests: list[GenerationRequest],
    sampling: SamplingParams,
    finished: Mapping[int, Episode],
    jobs: Sequence[RolloutJob],
) -> list[str]:
    """One batch through the policy; any failure becomes a :class:`RolloutError` keeping ``finished``."""
    total = len(jobs)
    pending = [pos for pos in range(total) if pos not in finished]
    try:
        replies = policy.generate(requests, sampling)
    except Exception as exc:
        raise RolloutError(
            f"the policy failed on a batch of {len(requests)} requests ({type(exc).__name__}: {exc}); "
            f"{len(finished)} of {total} episodes had finished and are kept in the error's .finished "
            f"(and were passed to on_episode); play the {len(pending)} jobs in .pending again to resume",
            finished=finished,
            pending=pending,
            jobs=jobs,
        ) from exc
    return _checked_replies(policy, replies, len(requests), finished, pending, jobs)


def _checked_replies(
    policy: ChatPolicy,
    replies: object,
    wanted: int,
    finished: Mapping[int, Episode],
    pending: Sequence[int],
    jobs: Sequence[RolloutJob],
) -> list[str]:
    """``replies`` checked to be a list of ``wanted`` strings; otherwise :class:`RolloutError`
    (keeping ``finished``) naming what the policy returned instead."""
    if not isinstance(replies, list) or len(replies) != wanted:
        got = f"{len(replies)} replies" if isinstance(replies, list) else repr(replies)[:80]
        problem = f"must return a list of {wanted} replies (one per request), got {got}"
    else:
        bad = next(((i, r) for i, r in enumerate(replies) if not isinstance(r, str)), None)
        if bad is None:
            return replies
        index, reply = bad
        problem = f"returned {type(reply).__name__} {reply!r:.60} as reply {index}; every reply must be a str"
    raise RolloutError(
        f"the policy {type(policy).__name__}.generate {problem}; {len(finished)} finished episodes are "
        "kept in .finished; fix the policy to return one str per request",
        finished=finished,
        pending=pending,
        jobs=jobs,
    )
