"""The rollout driver over a turn engine: each conversation advances as soon as its own turn returns.

:class:`StepEngine` below is a real implementation of :class:`~optima_env.policy.TurnEngine` (the
protocol, with its own queue and tickets), not a mock of the driver: every ``poll`` is one decode
step of every pending request, and a request needs 1 to 4 steps, a function of its key, so replies
come back unevenly, as a continuous-batching engine returns them. Its replies are a function of
the request alone (a seeded sampler), so its episodes can be compared with the batch driver's.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable, Sequence

import pytest

from optima_env import BackendError, BatchTurns, TurnEngine, make_task
from optima_env.errors import TaskContractError
from optima_env.policy import GenerationRequest, SamplingParams, ScriptedPolicy
from optima_env.rollout import DEFAULT_CONCURRENCY, RolloutError, RolloutJob, job_seed, make_jobs, rollout
from optima_env.types import Episode
from optima_trainers.config.train import GenerationConfig, TreeSearchConfig
from optima_trainers.tree.search import build_trees
from tests.helpers import TinyTask


def keyed_reply(request: GenerationRequest) -> str:
    """A function of the request's key and prompt only, like a per-request seeded sampler."""
    rng = random.Random(zlib.crc32(repr(request.key).encode()))
    turn = request.key[-1]
    if turn > 0 and rng.random() < 0.3:
        return f"<A>{request.messages[-1]['content'][-12:]}</A>"
    return rng.choice(["<A>Paris</A>", "<A>Rome</A>", f"turn {turn}", "no idea"])


def uneven(key: tuple[object, ...]) -> int:
    """Decode steps of a request: 1 to 4, from its key."""
    return 1 + zlib.crc32(repr(key).encode()) % 4


class StepEngine:
    """A turn engine whose every ``poll`` decodes one step of every pending request (see module)."""

    def __init__(
        self,
        reply: Callable[[GenerationRequest], str] = keyed_reply,
        *,
        steps: Callable[[tuple[object, ...]], int] = uneven,
        capacity: int | None = None,
        fail_at_poll: int | None = None,
    ) -> None:
        self.script = ScriptedPolicy(reply)
        self.steps = steps
        self._capacity = capacity
        self.fail_at_poll = fail_at_poll
        self.pending: dict[int, list] = {}
        """ticket -> [request, sampling, steps left]"""
        self.log: list[tuple[str, int, GenerationRequest]] = []
        """("submit" | "done", ticket, request) in the order they happened."""
        self.polls = 0
        self.most_pending = 0
        self.generate_calls: list[int] = []

    @property
    def capacity(self) -> int | None:
        return self._capacity

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        self.generate_calls.append(len(requests))
        return self.script.generate(requests, sampling)

    def submit(self, ticket: int, request: GenerationRequest, sampling: SamplingParams) -> None:
        if ticket in self.pending:
            raise TaskContractError(f"ticket {ticket} is pending")
        self.pending[ticket] = [request, sampling, self.steps(request.key)]
        self.log.append(("submit", ticket, request))
        self.most_pending = max(self.most_pending, len(self.pending))

    def poll(self) -> list[tuple[int, str]]:
        self.polls += 1
        if self.polls == self.fail_at_poll:
            self.pending.clear()
            raise BackendError("replica lost after 3 attempts")
        done: list[tuple[int, str]] = []
        while self.pending and not done:
            for ticket, slot in list(self.pending.items()):
                slot[2] -= 1
                if slot[2] == 0:
                    request, sampling, _ = self.pending.pop(ticket)
                    done.append((ticket, self.script.generate([request], sampling)[0]))
                    self.log.append(("done", ticket, request))
        return done


def overtakes(log: list[tuple[str, int, GenerationRequest]]) -> int:
    """How many turns were submitted while a request sent before the same conversation's previous
    turn returned was still pending (0 under a barrier per turn)."""
    at = {(kind, ticket): i for i, (kind, ticket, _) in enumerate(log)}
    done_at = {request.key: at["done", ticket] for kind, ticket, request in log if kind == "done"}
    submitted = [ticket for kind, ticket, _ in log if kind == "submit"]
    count = 0
    for i, (kind, _, request) in enumerate(log):
        *conversation, turn = request.key
        previous = done_at.get((*conversation, turn - 1))  # None: the conversation's first turn
        if kind != "submit" or previous is None:
            continue
        count += any(at["submit", u] < previous and at.get(("done", u), math.inf) > i for u in submitted)
    return count


TASK = make_task("ie/synth-v0")
ENV = {"max_turns": 7}


def barrier(jobs: Sequence[RolloutJob], concurrency: int = 4, **kwargs) -> list[Episode]:
    """The same jobs through the batch driver (one ``generate`` per turn of every conversation)."""
    return rollout(
        TASK, ScriptedPolicy(keyed_reply), jobs=jobs, concurrency=concurrency, env_kwargs=ENV, **kwargs
    )


def test_each_conversation_advances_on_its_own_and_the_episodes_equal_the_batch_drivers() -> None:
    jobs = make_jobs(range(6), num_samples=3, seed=11)
    engine = StepEngine(capacity=4)
    ended: list[int] = []
    episodes = rollout(TASK, engine, jobs=jobs, env_kwargs=ENV, on_episode=lambda pos, ep: ended.append(pos))
    assert episodes == barrier(jobs)
    assert [e.sample_id for e in episodes] == [TASK.samples("train")[j.index].id for j in jobs]
    assert [e.seed for e in episodes] == [j.seed for j in jobs]
    # they ended out of job order and came back in job order; concurrency came from the capacity
    assert sorted(ended) == list(range(len(jobs))) and ended != sorted(ended)
    assert engine.most_pending == engine.capacity and engine.generate_calls == []
    # a conversation's next turn went in while turns sent before its last one were still decoding
    assert overtakes(engine.log) > 0
    # the same engine with every request one step long behaves as a barrier: the measure can be 0
    lockstep = StepEngine(steps=lambda key: 1, capacity=4)
    assert rollout(TASK, lockstep, jobs=jobs, env_kwargs=ENV) == episodes
    assert overtakes(lockstep.log) == 0


def test_every_request_carries_its_jobs_key_and_session_under_both_drivers() -> None:
    jobs = make_jobs(range(4), num_samples=2, seed=3)
    engine = StepEngine(capacity=3)
    episodes = rollout(TASK, engine, jobs=jobs, env_kwargs=ENV)
    sent = [request for kind, _, request in engine.log if kind == "submit"]
    batched: list[GenerationRequest] = []
    rollout(TASK, ScriptedPolicy(lambda r: batched.append(r) or keyed_reply(r)), jobs=jobs, env_kwargs=ENV)
    for requests in (sent, batched):
        by_job = {job.seed: sorted(r.key for r in requests if r.session == (job.seed,)) for job in jobs}
        assert by_job == {j.seed: [(j.seed, t) for t in range(len(e.turns))] for j, e in zip(jobs, episodes)}
        assert len(requests) == sum(len(e.turns) for e in episodes)


def test_refilled_jobs_join_without_waiting_for_the_others() -> None:
    jobs = make_jobs(range(3), num_samples=1, seed=5)
    added: list[RolloutJob] = []
    calls: list[list[int]] = []

    def refill(ended: Sequence[tuple[int, Episode]]) -> list[RolloutJob]:
        calls.append([pos for pos, _ in ended])
        new = [RolloutJob(index=p + 3, sample=0, seed=job_seed(5, p + 3, 0)) for p, _ in ended if p < 3]
        added.extend(new)
        return new

    engine = StepEngine(capacity=3)
    episodes = rollout(TASK, engine, jobs=jobs, env_kwargs=ENV, refill=refill)
    assert len(added) == 3 and episodes == barrier(jobs + added, concurrency=3)
    assert all(c == sorted(c) for c in calls) and sorted(p for c in calls for p in c) == list(range(6))
    # the first refilled job started before the last given one ended (no drain between them)
    given, refilled = {j.seed for j in jobs}, {j.seed for j in added}
    first_refilled = min(
        i for i, (k, _, r) in enumerate(engine.log) if k == "submit" and r.key[0] in refilled
    )
    last_given = max(i for i, (k, _, r) in enumerate(engine.log) if k == "done" and r.key[0] in given)
    assert first_refilled < last_given


def test_a_tree_search_through_a_turn_engine_grows_the_trees_of_the_batch_driver() -> None:
    def grow(policy) -> list[dict]:
        trees = build_trees(
            TinyTask(),
            policy,
            [0, 1, 0],
            keys=[0, 1, 2],
            seed=7,
            reward_fn=lambda eps: [len(e.turns) / 5 for e in eps],
            search=TreeSearchConfig(selections=3, rollouts=3, top_k=3),
            generation=GenerationConfig(max_turns=5),
        )
        return [t.to_dict() for t in trees]

    engine = StepEngine()
    assert grow(engine) == grow(ScriptedPolicy(keyed_reply))
    # every rollout of one tree shares the tree's env seed, hence its session (one replica)
    sessions = {r.session for kind, _, r in engine.log if kind == "submit"}
    assert len(sessions) == 3 and overtakes(engine.log) > 0


def test_a_poll_failure_keeps_the_finished_episodes_and_lists_the_pending_jobs() -> None:
    jobs = make_jobs(range(8), num_samples=1, seed=2)
    full = barrier(jobs, concurrency=3)
    seen: dict[int, Episode] = {}
    engine = StepEngine(capacity=3, fail_at_poll=12)
    with pytest.raises(RolloutError, match=r"the policy failed with \d+ requests in flight") as info:
        rollout(TASK, engine, jobs=jobs, env_kwargs=ENV, on_episode=lambda pos, ep: seen.setdefault(pos, ep))
    err = info.value
    assert isinstance(err, BackendError) and isinstance(err.__cause__, BackendError)
    assert f"{len(seen)} of {len(jobs)} episodes had finished" in str(err)
    assert err.finished == seen and err.finished and err.pending and err.jobs == jobs
    assert sorted([*err.finished, *err.pending]) == list(range(len(jobs)))
    assert all(full[pos] == episode for pos, episode in err.finished.items())
    resumed = rollout(TASK, StepEngine(capacity=3), jobs=[jobs[i] for i in err.pending], env_kwargs=ENV)
    assert resumed == [full[i] for i in err.pending]


def test_a_call_ended_by_its_caller_leaves_nothing_that_confuses_the_next_call() -> None:
    jobs = make_jobs(range(5), num_samples=1, seed=4)
    engine = StepEngine(capacity=3)

    def disk_full(pos: int, episode: Episode) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        rollout(TASK, engine, jobs=jobs, env_kwargs=ENV, on_episode=disk_full)
    assert engine.pending  # the aborted call's turns are still in the engine
    assert rollout(TASK, engine, jobs=jobs, env_kwargs=ENV) == barrier(jobs, concurrency=3)


class Silent(StepEngine):
    def poll(self):
        return []


class Stranger(StepEngine):
    def poll(self):
        return [(ticket + 1000, reply) for ticket, reply in super().poll()]


class Mute(StepEngine):
    def poll(self):
        return [(ticket, None) for ticket, _ in super().poll()]


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        (Silent(), "returned no reply with 2 requests pending; it must block"),
        (Stranger(), r"returned ticket \d+, which is not pending"),
        (Mute(), r"returned NoneType None as the reply of ticket \d+; every reply must be a str"),
    ],
)
def test_an_engine_that_breaks_the_contract_is_a_rollout_error(engine: StepEngine, message: str) -> None:
    with pytest.raises(RolloutError, match=message) as info:
        rollout(TASK, engine, jobs=make_jobs(range(2), 1, seed=0), env_kwargs=ENV)
    assert info.value.pending == [0, 1] and info.value.finished == {}


def test_the_batch_driver_over_a_turn_engine_uses_generate_with_its_capacity() -> None:
    jobs = make_jobs(range(6), num_samples=1, seed=8)
    engine = StepEngine(capacity=4)
    assert isinstance(engine, TurnEngine)
    assert rollout(TASK, engine, jobs=jobs, env_kwargs=ENV, driver="batch") == barrier(jobs)
    assert engine.log == [] and max(engine.generate_calls) == engine.capacity
    with pytest.raises(TaskContractError, match="driver='turns' needs a policy that implements TurnEngine"):
        rollout(TASK, ScriptedPolicy(keyed_reply), jobs=jobs, driver="turns")
    with pytest.raises(TaskContractError, match="driver must be one of auto, batch, turns, got 'fast'"):
        rollout(TASK, engine, jobs=jobs, driver="fast")


def test_concurrency_none_is_the_engines_capacity_else_the_default() -> None:
    jobs = make_jobs(range(DEFAULT_CONCURRENCY + 4), num_samples=1, seed=0)
    unbounded = StepEngine(capacity=None)
    rollout(TASK, unbounded, jobs=jobs, env_kwargs={"max_turns": 2})
    assert unbounded.most_pending == DEFAULT_CONCURRENCY

    class Sized(ScriptedPolicy):
        capacity = 5

    sized = Sized(keyed_reply)
    rollout(TASK, sized, jobs=jobs[:12], env_kwargs={"max_turns": 2})
    assert max(sized.calls) == sized.capacity
    with pytest.raises(TaskContractError, match="capacity must be an int >= 1 or None, got 0"):
        rollout(TASK, StepEngine(capacity=0), jobs=jobs)
    with pytest.raises(TaskContractError, match="concurrency must be an int >= 1"):
        rollout(TASK, StepEngine(), jobs=jobs, concurrency=0)


def test_batch_turns_answers_everything_queued_as_one_batch_per_sampling() -> None:
    policy = ScriptedPolicy(lambda r: "hi")
    turns = BatchTurns(policy)
    assert isinstance(turns, TurnEngine) and turns.capacity is None
    greedy, hot = SamplingParams(temperature=0), SamplingParams(temperature=1.0, stop=("i",))
    for ticket, sampling in ((5, greedy), (2, hot), (9, greedy)):
        turns.submit(ticket, GenerationRequest(messages=[], prefix=f"A{ticket}:"), sampling)
    with pytest.raises(TaskContractError, match="ticket 9 is already pending"):
        turns.submit(9, GenerationRequest(messages=[]), greedy)
    assert turns.poll() == [(5, "A5: hi"), (2, "A2: h"), (9, "A9: hi")]
    assert policy.calls == [2, 1] and turns.poll() == []
    assert BatchTurns(StepEngine(capacity=6)).capacity == 6

    class Short(ScriptedPolicy):
        def generate(self, requests, sampling):
            return super().generate(requests, sampling)[:-1]

    short = BatchTurns(Short(lambda r: "hi"))
    short.submit(0, GenerationRequest(messages=[]), greedy)
    short.submit(1, GenerationRequest(messages=[]), greedy)
    with pytest.raises(TaskContractError, match=r"Short.generate must return a list of 2 replies .* got 1"):
        short.poll()
    assert short.poll() == []  # nothing stays pending after a failure
