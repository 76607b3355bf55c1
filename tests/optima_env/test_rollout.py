"""The batched rollout engine against one-at-a-time play, with a scripted policy."""

from __future__ import annotations

import pytest

from optima_env import ConversationEnv, make_task
from optima_env.policy import GenerationRequest, SamplingParams, ScriptedPolicy
from optima_env.rollout import make_jobs, rollout, run_episode


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
