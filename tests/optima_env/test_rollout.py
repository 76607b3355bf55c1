"""The batched rollout engine against one-at-a-time play, with a scripted policy."""

from __future__ import annotations

import pytest

from optima_env import BackendError, ConversationEnv, make_task
from optima_env.policy import (
    GenerationRequest,
    SamplingParams,
    ScriptedPolicy,
    finish_reply,
    request_seed,
    speaker_stops,
)
from optima_env.rollout import RolloutError, make_jobs, rollout, run_episode
from tests.helpers import FailingAfter


def seeded_reply(request: GenerationRequest) -> str:
    """Depends on the request's identity (seed, turn) and content, like a seeded sampler."""
    seed, turn = request.key
    n_facts = request.messages[0]["content"].count(".")
    if (seed + turn) % 3 == 0 and turn > 0:
        return f"<A>{request.messages[-1]['content'][-12:]}</A>"
    return f"turn {turn} facts {n_facts} seed {seed % 97}"


@pytest.mark.parametrize("concurrency", [1, 3, 32])
def test_batched_rollout_equals_sequential_play(concurrency: int) -> None:
    task = make_task("ie/synth-v0")
    jobs = make_jobs(range(6), num_samples=3, seed=11)
    policy = ScriptedPolicy(seeded_reply)
    batched = rollout(task, policy, jobs=jobs, concurrency=concurrency, env_kwargs={"max_turns": 7})
    sequential = [
        run_episode(
            ConversationEnv(task, max_turns=7),
            ScriptedPolicy(seeded_reply),
            seed=job.seed,
            options={"index": job.index},
        )
        for job in jobs
    ]
    assert batched == sequential
    assert [e.sample_id for e in batched] == [task.samples("train")[j.index].id for j in jobs]
    assert max(policy.calls) == min(concurrency, len(jobs))


def test_rollout_keeps_the_batch_full_and_reports_each_episode() -> None:
    task = make_task("ie/synth-v0")
    jobs = make_jobs(range(10), num_samples=1, seed=0)
    finished: list[int] = []
    policy = ScriptedPolicy(seeded_reply)
    episodes = rollout(
        task, policy, jobs=jobs, concurrency=4, on_episode=lambda pos, ep: finished.append(pos)
    )
    assert sorted(finished) == list(range(10)) and len(episodes) == 10
    assert policy.calls[0] == 4
    assert sum(policy.calls) == sum(len(e.turns) for e in episodes)


def test_sampling_params_validate() -> None:
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


def test_a_backend_failure_keeps_the_finished_episodes_and_says_what_is_left() -> None:
    task = make_task("ie/synth-v0")
    jobs = make_jobs(range(5), num_samples=1, seed=3)
    seen: dict[int, object] = {}
    # "<A>Paris</A>" twice ends an episode after 2 turns: with 2 slots, calls 1-2 finish jobs 0-1,
    # calls 3-4 finish jobs 2-3, and call 5 fails with job 4 in flight.
    with pytest.raises(RolloutError, match=r"4 of 5 episodes had finished") as info:
        rollout(
            task,
            FailingAfter(5),
            jobs=jobs,
            concurrency=2,
            on_episode=lambda pos, ep: seen.setdefault(pos, ep),
        )
    err = info.value
    assert isinstance(err, BackendError) and isinstance(err.__cause__, BackendError)
    assert sorted(err.finished) == [0, 1, 2, 3] and err.pending == [4]
    assert err.finished == seen and err.episodes == [seen[i] for i in range(4)]
    resumed = rollout(task, ScriptedPolicy(lambda r: "<A>Paris</A>"), jobs=[jobs[i] for i in err.pending])
    full = rollout(task, ScriptedPolicy(lambda r: "<A>Paris</A>"), jobs=jobs)
    assert err.episodes + resumed == full


def test_a_policy_returning_the_wrong_number_of_replies_is_an_error_that_keeps_work() -> None:
    class Short(ScriptedPolicy):
        def generate(self, requests, sampling):
            return super().generate(requests, sampling)[:-1]

    with pytest.raises(RolloutError, match="list of 2 replies"):
        rollout(make_task("ie/synth-v0"), Short(lambda r: "hi"), jobs=make_jobs(range(2), 1, seed=0))


def test_stop_at_speaker_tags_cuts_an_impersonating_turn() -> None:
    task = make_task("ie/synth-v0")
    policy = ScriptedPolicy(lambda r: "I hold fact X.\nBob: thanks, <A>Rome</A>")
    jobs = make_jobs(range(1), num_samples=1, seed=0)
    plain = rollout(task, policy, jobs=jobs, env_kwargs={"max_turns": 2})[0]
    cut = rollout(task, policy, jobs=jobs, env_kwargs={"max_turns": 2}, stop_at_speaker_tags=True)[0]
    assert "Bob: thanks" in plain.turns[0].text
    assert [t.text for t in cut.turns] == ["Alice: I hold fact X.", "Bob: I hold fact X."]


def test_reply_helpers() -> None:
    assert speaker_stops(["Alice", "Bob"]) == ("Alice:", "Bob:")
    assert finish_reply("Bob:", " a Alice: b Bob: c", ("Bob:", "Alice:")) == "Bob: a "
    assert finish_reply("", "no stop", ()) == "no stop"
    assert request_seed(1, (2, 3)) == request_seed(1, (2, 3)) != request_seed(1, (3, 2))
    with pytest.raises(ValueError, match="stop must be a tuple"):
        SamplingParams(stop=["Bob:"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stop must be a tuple"):
        SamplingParams(stop=("",))


@pytest.mark.parametrize("bad", [None, 5, b"bytes"])
def test_a_policy_returning_a_non_string_reply_is_a_rollout_error(bad) -> None:
    """``None`` or a non-string reply is the documented RolloutError, naming what came back."""

    class Broken(ScriptedPolicy):
        def generate(self, requests, sampling):
            return [bad for _ in requests]

    task = make_task("ie/synth-v0")
    with pytest.raises(
        RolloutError, match=f"returned {type(bad).__name__} .* as reply 0; every reply must be a str"
    ):
        rollout(task, Broken(lambda r: "x"), jobs=make_jobs(range(2), 1, seed=0))
    with pytest.raises(RolloutError, match="every reply must be a str"):
        run_episode(ConversationEnv(task), Broken(lambda r: "x"), seed=0)
