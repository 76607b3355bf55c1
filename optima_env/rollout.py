"""Play conversations with a policy: one at a time, or many at once through a turn engine.

:func:`rollout` keeps up to ``concurrency`` episodes in flight and plays them through a
:class:`~optima_env.policy.TurnEngine`: each conversation submits its next turn the moment its last
one came back, and a finished conversation's slot goes to the next queued job at once. Two drivers
(``driver=``, see :data:`~optima_env.turns.DRIVERS`):

* **turns** (what ``auto`` picks for a policy that implements :class:`~optima_env.policy.TurnEngine`:
  vLLM's engine, the transformers engine's continuous batching, the OpenAI-compatible client): the
  engine runs the submitted turns as it likes and ``poll`` hands back each reply as soon as it is
  done, so no conversation waits for another's turn;
* **batch** (what ``auto`` picks for any other :class:`~optima_env.policy.ChatPolicy`, and what
  ``driver="batch"`` forces): :class:`~optima_env.turns.BatchTurns` answers everything submitted
  as ONE ``generate`` batch per poll, so every step gathers the current turn of each running
  conversation (in job order), waits for the batch's longest reply, steps each env and refills the
  freed slots: a barrier per turn, the batches of the driver before turn engines existed.

Episodes come back in job order (instance by instance, sample by sample) whatever the order they
finished in, each job's seed is a pure function of ``(seed, instance, sample)`` and each request's
key is a function of its job and turn, so with a scripted (or per-request seeded) policy the
result equals playing the jobs one by one with :func:`run_episode`, under either driver. Every
request of a job carries ``session=(job.seed,)``: a backend with several replicas keeps the
conversation (and the rollouts of one tree search, which share the env seed) on one replica.

Work that depends on finished episodes can join the same loop: ``refill`` is called after every
poll in which episodes ended, and the jobs it returns are queued behind the others (a tree search
enqueues a tree's next rollouts as soon as its last ones end, so the engine stays busy across
trees). A refilled job's position is the next free one: the given jobs are ``0 .. len(jobs) - 1``,
then the refilled ones in the order they were returned. Under the batch driver which poll an
episode ends in is fixed by the jobs; under a native engine it depends on the engine's timing, so
the grouping of the ``refill`` calls (and the positions of the jobs they add) may vary between
runs, while each episode's content does not.

The replies of one poll are handled in job order: each env is stepped, and a continuing
conversation's next turn is submitted at once while an ended one's episode goes to ``on_episode``;
then ``refill`` runs and the freed slots are filled (so a native engine already generates the next
turns while ``refill`` scores).

Failures: when the engine raises (an HTTP backend gives up after its retries, a model runs out of
memory, ...), or breaks its contract, :func:`rollout` raises :class:`RolloutError`, a
:class:`~optima_env.errors.BackendError` that keeps every episode finished so far
(``err.finished``, by job position; they were also passed to ``on_episode``) and lists the jobs
still to play (``err.pending``), so a caller can save the work and resume with
``jobs=[jobs[i] for i in err.pending]`` (``err.jobs`` lists every job by position, the refilled
ones included; a resumed call gets no refill for what it replays unless it passes one again).
Tickets are unique across calls, so when a call ends early on an error that is not the engine's
(``on_episode`` or ``refill`` raised), the replies it left in a native engine are recognized and
dropped by the next call on the same engine. One engine serves one rollout call at a time.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optima_env.conversation_env import ConversationEnv
from optima_env.errors import RolloutError, TaskContractError
from optima_env.policy import ChatPolicy, GenerationRequest, SamplingParams, TurnEngine, speaker_stops
from optima_env.task import Task
from optima_env.turns import BatchTurns, reply_problem, turn_engine
from optima_env.types import Episode

__all__ = [
    "BatchTurns",
    "RolloutError",
    "RolloutJob",
    "job_seed",
    "make_jobs",
    "resolve_concurrency",
    "rollout",
    "run_episode",
]

DEFAULT_CONCURRENCY = 32
"""Episodes in flight when neither the caller nor the engine's ``capacity`` says how many."""

_TICKETS = itertools.count()
"""Engine tickets, unique in the process (see the module docstring on early ends)."""


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


def _request(env: ConversationEnv, key: tuple[object, ...], session: tuple[object, ...]) -> GenerationRequest:
    agent = env.agent_selection
    return GenerationRequest(
        messages=env.chat_messages(agent),
        prefix=env.reply_prefix(agent),
        agent=agent,
        key=key,
        session=session,
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
        request = _request(env, (seed, len(env.turns)), (seed,))
        replies = policy.generate([request], sampling)
        problem = reply_problem(replies, 1)
        if problem is not None:
            raise RolloutError(
                f"the policy {type(policy).__name__}.generate {problem}; fix the policy to return one "
                "str per request",
                finished={},
                pending=[0],
            )
        env.step(replies[0])
    return env.episode


# size: the rollout driver's public API: jobs, sampling and keyword options with defaults
def rollout(
    task: Task,
    policy: ChatPolicy,
    *,
    jobs: Sequence[RolloutJob],
    sampling: SamplingParams | None = None,
    concurrency: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    on_episode: Callable[[int, Episode], None] | None = None,
    progress: bool | None = None,
    reset_options: Callable[[RolloutJob], Mapping[str, Any]] | None = None,
    stop_at_speaker_tags: bool = False,
    request_key: Callable[[RolloutJob, int], tuple[object, ...]] | None = None,
    refill: Callable[[Sequence[tuple[int, Episode]]], Sequence[RolloutJob]] | None = None,
    driver: str = "auto",
) -> list[Episode]:
    """Play every job, ``concurrency`` at a time, each conversation's turn submitted as soon as its
    last one returned (see the module docstring for the two drivers).

    Args:
        task: the task to play (shared by every env; its data is loaded once).
        policy: the generation backend: a :class:`~optima_env.policy.TurnEngine` or any
            :class:`~optima_env.policy.ChatPolicy`.
        jobs: what to play (see :func:`make_jobs`).
        sampling: sampling parameters for every turn.
        concurrency: episodes in flight (under the batch driver: the batch size per step, at most);
            ``None`` (the default): the engine's ``capacity`` (for the batch driver, the policy's
            own ``capacity`` if it declares one), else :data:`DEFAULT_CONCURRENCY`.
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
        refill: called after each poll in which episodes ended, with their ``(position, episode)``
            in position order (after ``on_episode`` saw each); the jobs it returns are queued
            behind the pending ones and played in the same loop, taking the positions
            ``len(jobs), len(jobs) + 1, ...`` in the order they were returned. Jobs that depend on
            finished episodes (a tree's next rollouts) thus keep the engine busy.
        driver: ``"auto"`` (default), ``"batch"`` or ``"turns"`` (:data:`~optima_env.turns.DRIVERS`).

    Returns:
        The episodes, in the order of ``jobs``, then those of the refilled jobs in position order.

    Raises:
        RolloutError: the policy failed; the error carries the episodes finished before it.
        TaskContractError: a bad ``concurrency`` or ``driver``, or ``refill`` returned other than jobs.
    """
    engine = turn_engine(policy, driver)
    concurrency = _concurrency(concurrency, engine)
    sampling = sampling or SamplingParams()
    if stop_at_speaker_tags:
        extra = tuple(s for s in speaker_stops(task.agents) if s not in sampling.stop)
        sampling = dataclasses.replace(sampling, stop=sampling.stop + extra)
    run = _Run(
        task=task,
        engine=engine,
        sampling=sampling,
        jobs=list(jobs),
        env_kwargs=dict(env_kwargs or {}),
        reset_options=reset_options,
        request_key=request_key,
        on_episode=on_episode,
        refill=refill,
    )
    if progress is None:
        progress = sys.stderr.isatty()
    if progress:
        from tqdm.auto import tqdm

        run.bar = tqdm(total=len(run.jobs), desc=f"rollout {task.id}", unit="ep")
    try:
        run.play(concurrency)
    finally:
        if run.bar is not None:
            run.bar.close()
    return [run.finished[pos] for pos in range(len(run.jobs))]


def resolve_concurrency(policy: ChatPolicy, concurrency: int | None = None, driver: str = "auto") -> int:
    """The episodes :func:`rollout` keeps in flight for these arguments: ``concurrency``, else the
    engine's ``capacity``, else :data:`DEFAULT_CONCURRENCY` (for a caller that sizes its own work
    from it, as the tree scheduler does)."""
    return _concurrency(concurrency, turn_engine(policy, driver))


def _concurrency(concurrency: int | None, engine: TurnEngine) -> int:
    """The episodes to keep in flight: the caller's, else the engine's capacity, else the default."""
    if concurrency is None:
        capacity = engine.capacity
        if capacity is None:
            return DEFAULT_CONCURRENCY
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise TaskContractError(
                f"the turn engine {type(engine).__name__}.capacity must be an int >= 1 or None, got "
                f"{capacity!r}; fix the engine, or pass concurrency= to rollout"
            )
        return capacity
    if not isinstance(concurrency, int) or concurrency < 1:
        raise TaskContractError(f"concurrency must be an int >= 1 or None, got {concurrency!r}")
    return concurrency


@dataclass(slots=True, kw_only=True)
class _Run:
    """The state of one :func:`rollout` call: the jobs by position, the conversations in flight by
    ticket, the finished episodes by position, and the hooks."""

    task: Task
    engine: TurnEngine
    sampling: SamplingParams
    jobs: list[RolloutJob]
    """Grows with the refilled jobs: position -> job."""
    env_kwargs: dict[str, Any]
    reset_options: Callable[[RolloutJob], Mapping[str, Any]] | None
    request_key: Callable[[RolloutJob, int], tuple[object, ...]] | None
    on_episode: Callable[[int, Episode], None] | None
    refill: Callable[[Sequence[tuple[int, Episode]]], Sequence[RolloutJob]] | None
    bar: Any = None
    finished: dict[int, Episode] = field(default_factory=dict)
    flying: dict[int, tuple[int, RolloutJob, ConversationEnv]] = field(default_factory=dict)
    """ticket -> (position, job, env) of every conversation whose turn the engine holds."""
    first_ticket: int = field(default_factory=lambda: next(_TICKETS))
    """Tickets below it are an earlier call's (see the module docstring)."""

    def play(self, concurrency: int) -> None:
        """Play every job and every refilled one to its end."""
        queue = deque(enumerate(self.jobs))
        self._admit(queue, concurrency)
        while self.flying:
            ended = self._advance(self._poll())
            if self.refill is not None and ended:
                added = _checked_jobs(self.refill(ended))
                queue.extend(enumerate(added, start=len(self.jobs)))
                self.jobs.extend(added)
                if self.bar is not None and added:
                    self.bar.total += len(added)
                    self.bar.refresh()
            self._admit(queue, concurrency)

    def _admit(self, queue: deque[tuple[int, RolloutJob]], concurrency: int) -> None:
        """Start queued jobs (in position order) until ``concurrency`` conversations are in flight."""
        while queue and len(self.flying) < concurrency:
            pos, job = queue.popleft()
            env = ConversationEnv(self.task, **self.env_kwargs)
            options = dict(self.reset_options(job)) if self.reset_options else {"index": job.index}
            env.reset(seed=job.seed, options=options)
            self._submit(pos, job, env)

    def _submit(self, pos: int, job: RolloutJob, env: ConversationEnv) -> None:
        """Hand the conversation's current turn to the engine."""
        turn = len(env.turns)
        key = self.request_key(job, turn) if self.request_key else (job.seed, turn)
        ticket = next(_TICKETS)
        try:
            self.engine.submit(ticket, _request(env, key, (job.seed,)), self.sampling)
        except Exception as exc:
            raise self._failure(
                f"the policy failed to accept a request ({type(exc).__name__}: {exc})"
            ) from exc
        self.flying[ticket] = (pos, job, env)

    def _poll(self) -> list[tuple[int, str]]:
        """The engine's finished ``(ticket, reply)`` pairs, checked, in position order."""
        try:
            pairs = self.engine.poll()
        except Exception as exc:
            raise self._failure(
                f"the policy failed with {len(self.flying)} requests in flight ({type(exc).__name__}: {exc})"
            ) from exc
        name = type(self.engine).__name__
        if not isinstance(pairs, list):
            raise self._failure(f"{name}.poll must return a list of (ticket, reply) pairs, got {pairs!r:.80}")
        mine: dict[int, str] = {}
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], int)):
                raise self._failure(
                    f"{name}.poll returned {pair!r:.80}; each item must be an (int ticket, str reply) pair"
                )
            ticket, reply = pair
            if ticket < self.first_ticket:
                continue  # an earlier call's request, left in the engine when that call ended early
            if not isinstance(reply, str):
                raise self._failure(
                    f"{name}.poll returned {type(reply).__name__} {reply!r:.60} as the reply of ticket "
                    f"{ticket}; every reply must be a str"
                )
            if ticket not in self.flying or ticket in mine:
                raise self._failure(f"{name}.poll returned ticket {ticket}, which is not pending (or twice)")
            mine[ticket] = reply
        if not pairs:
            raise self._failure(
                f"{name}.poll returned no reply with {len(self.flying)} requests pending; it must block "
                "until at least one is done"
            )
        return sorted(mine.items(), key=lambda pair: self.flying[pair[0]][0])

    def _advance(self, replies: list[tuple[int, str]]) -> list[tuple[int, Episode]]:
        """Step each conversation with its reply; submit its next turn, or record its episode."""
        ended: list[tuple[int, Episode]] = []
        for ticket, reply in replies:
            pos, job, env = self.flying.pop(ticket)
            env.step(reply)
            if env.episode is None:
                self._submit(pos, job, env)
                continue
            self.finished[pos] = env.episode
            ended.append((pos, env.episode))
            if self.on_episode is not None:
                self.on_episode(pos, env.episode)
            if self.bar is not None:
                self.bar.update(1)
        return ended

    def _failure(self, what: str) -> RolloutError:
        """A :class:`RolloutError` keeping the finished episodes and listing the rest."""
        total = len(self.jobs)
        pending = [pos for pos in range(total) if pos not in self.finished]
        return RolloutError(
            f"{what}; {len(self.finished)} of {total} episodes had finished and are kept in the error's "
            f".finished (and were passed to on_episode); play the {len(pending)} jobs in .pending again "
            "to resume",
            finished=self.finished,
            pending=pending,
            jobs=self.jobs,
        )


def _checked_jobs(added: object) -> list[RolloutJob]:
    """What ``refill`` returned, checked: a sequence of :class:`RolloutJob`."""
    if not isinstance(added, Sequence) or not all(isinstance(j, RolloutJob) for j in added):
        raise TaskContractError(f"refill must return a sequence of RolloutJob, got {added!r}")
    return list(added)
