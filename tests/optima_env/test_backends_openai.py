"""The OpenAI-compatible HTTP backend against real servers on 127.0.0.1.

Fast tests start a small HTTP server (``http.server`` in a thread) that answers in the OpenAI
chat-completion schema, fails with 500 or 429, or hangs, to check concurrency, rotation, retries,
timeouts and errors. The slow tests start vLLM's OpenAI server on the embedded model.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from optima_env import BackendError, make_task
from optima_env.policy import GenerationRequest, SamplingParams
from optima_env.rollout import RolloutError, make_jobs, rollout
from tests.optima_env.backend_contract import chat_requests, check_contract
from tests.optima_env.vllm_server import vllm_openai_servers

httpx = pytest.importorskip("httpx")

from optima_env.backends.openai import OpenAIChatPolicy  # noqa: E402

SECRET = "sk-test-0123456789-very-secret"


class StubServer:
    """A real HTTP server on loopback whose behaviour per request is ``behave(n, body) -> action``.

    Actions: ``("ok", content)``, ``("status", code)``, ``("hang", seconds)``, ``("bad", raw body)``.
    """

    def __init__(self, behave) -> None:
        self.behave = behave
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.requests.append(body)
                    stub.headers.append(dict(self.headers))
                    n = len(stub.requests)
                    stub.active += 1
                    stub.max_active = max(stub.max_active, stub.active)
                try:
                    kind, value = stub.behave(n, body)
                    if kind == "hang":
                        time.sleep(value)
                        kind, value = "status", 504
                    if kind == "ok":
                        payload = {
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": value}}]
                        }
                        self._send(200, json.dumps(payload).encode())
                    elif kind == "bad":
                        self._send(200, value.encode())
                    else:
                        self._send(
                            value, b'{"error": "stub failure"}', retry_after=kind == "status" and value == 429
                        )
                finally:
                    with stub.lock:
                        stub.active -= 1

            def _send(self, code: int, data: bytes, retry_after: bool = False) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if retry_after:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def echo(n: int, body: dict) -> tuple[str, object]:
    """Answers with the system prompt's first words (and an own "Name:" tag for Bob's prompts)."""
    first = body["messages"][0]["content"].split(".")[0]
    return "ok", (f"Bob: {first}" if "You are Bob" in first else f"{first} (seed {body.get('seed')})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


def fast_policy(urls, **kwargs) -> OpenAIChatPolicy:
    kwargs.setdefault("backoff", 0.01)
    return OpenAIChatPolicy("stub-model", urls, **kwargs)


def test_a_batch_goes_out_concurrently_and_comes_back_in_order() -> None:
    def slow_echo(n, body):
        time.sleep(0.2)
        return echo(n, body)

    requests = chat_requests(8)
    with StubServer(slow_echo) as server, fast_policy(server.url, max_concurrency=8) as policy:
        replies = check_contract(policy, requests, max_new_tokens=8)
        assert server.max_active > 1
    assert replies[1].startswith("Bob: You are Bob") and not replies[1].startswith("Bob: Bob:")
    assert replies[0].startswith("Alice: You are Alice")
    bodies = server.requests[: len(requests)]  # the first batch, in the order the requests arrived
    assert all(b["model"] == "stub-model" and b["max_tokens"] == 8 and b["temperature"] == 0 for b in bodies)
    sent = sorted(json.dumps(b["messages"], sort_keys=True) for b in bodies)  # concurrent: any order
    assert sent == sorted(json.dumps([dict(m) for m in r.messages], sort_keys=True) for r in requests)


def test_requests_rotate_over_base_urls_and_carry_seeds_stops_and_the_key(monkeypatch) -> None:
    monkeypatch.setenv("MY_KEY", SECRET)
    with StubServer(echo) as a, StubServer(echo) as b:
        policy = fast_policy([a.url, b.url], api_key_env="MY_KEY", max_concurrency=1)
        sampling = SamplingParams(temperature=0.5, max_new_tokens=4, seed=7, stop=("Bob:",), ignore_eos=True)
        policy.generate(chat_requests(4), sampling)
        policy.close()
    assert len(a.requests) == len(b.requests) == 2
    assert {h["Authorization"] for h in a.headers + b.headers} == {f"Bearer {SECRET}"}
    seeds = [r["seed"] for r in a.requests + b.requests]
    assert len(set(seeds)) == 4
    assert all(r["stop"] == ["Bob:"] and r["ignore_eos"] is True for r in a.requests)


def test_continue_mode_sends_the_prefix_as_the_final_assistant_message() -> None:
    with StubServer(lambda n, body: ("ok", " continued")) as server:
        with fast_policy(server.url, prefix_mode="continue") as policy:
            reply = policy.generate(chat_requests(1), SamplingParams(max_new_tokens=4))
    assert reply == ["Alice: continued"]
    body = server.requests[0]
    assert body["messages"][-1] == {"role": "assistant", "content": "Alice:"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False


def test_500_and_429_are_retried_with_rotation_then_succeed() -> None:
    def flaky(n, body):
        return ("status", 500) if n == 1 else ("status", 429) if n == 2 else echo(n, body)

    with StubServer(flaky) as server, fast_policy([server.url], max_retries=3) as policy:
        reply = policy.generate(chat_requests(1), SamplingParams(max_new_tokens=4))
    assert reply[0].startswith("Alice: You are Alice") and len(server.requests) == 3

    with StubServer(lambda n, b: ("status", 503)) as down, StubServer(echo) as up:
        with fast_policy([down.url, up.url], max_retries=1, max_concurrency=1) as policy:
            assert len(policy.generate(chat_requests(4), SamplingParams(max_new_tokens=4))) == 4
    assert len(down.requests) == 2 and len(up.requests) == 4  # each failure moved on to the next URL


@pytest.mark.parametrize("failure", ["500", "down", "timeout", "not-json"])
def test_a_persistent_failure_gives_a_clear_error_after_the_retries(failure: str) -> None:
    behave = {
        "500": lambda n, b: ("status", 500),
        "timeout": lambda n, b: ("hang", 2.0),
        "not-json": lambda n, b: ("bad", "<html>oops</html>"),
        "down": echo,
    }[failure]
    with StubServer(behave) as server:
        url = closed_port_url() if failure == "down" else server.url
        policy = fast_policy(url, max_retries=2, timeout=0.3, connect_timeout=0.3)
        with pytest.raises(BackendError) as info:
            policy.generate(chat_requests(2), SamplingParams(max_new_tokens=4))
        policy.close()
    message = str(info.value)
    if failure == "not-json":
        assert "not JSON" in message and len(server.requests) == 2  # not retried
        return
    assert "2 of 2 chat requests failed" in message and "after 3 attempts" in message
    assert {"500": "HTTP 500", "down": "ConnectError", "timeout": "no answer within 0.3s"}[failure] in message
    if failure != "down":
        assert len(server.requests) == 6


def test_a_client_error_is_not_retried() -> None:
    with StubServer(lambda n, b: ("status", 404)) as server, fast_policy(server.url) as policy:
        with pytest.raises(BackendError, match=r"rejected the chat request.*HTTP 404.*model name"):
            policy.generate(chat_requests(1), SamplingParams(max_new_tokens=4))
    assert len(server.requests) == 1


def test_the_api_key_is_never_logged_nor_shown(monkeypatch, caplog) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    with StubServer(lambda n, b: ("status", 500) if n < 3 else ("status", 401)) as server:
        policy = fast_policy(server.url, max_retries=3)
        with pytest.raises(BackendError) as info:
            policy.generate(chat_requests(1), SamplingParams(max_new_tokens=4))
        policy.close()
    assert server.headers[0]["Authorization"] == f"Bearer {SECRET}"
    assert "retrying" in caplog.text and "HTTP 500" in caplog.text
    assert SECRET not in caplog.text and SECRET not in str(info.value) and SECRET not in repr(policy)
    assert SECRET not in str(vars(policy))


def test_finished_episodes_are_kept_when_the_server_goes_down() -> None:
    # Every answer is "<A>Ivofen</A>", so an episode ends after 2 turns; the server dies after 4 answers.
    def dies(n, body):
        return ("ok", "<A>Ivofen</A>") if n <= 4 else ("status", 500)

    task = make_task("ie/synth-v0")
    seen = []
    with StubServer(dies) as server, fast_policy(server.url, max_retries=1) as policy:
        with pytest.raises(RolloutError, match="2 of 3 episodes had finished") as info:
            rollout(
                task,
                policy,
                jobs=make_jobs(range(3), 1, seed=0),
                concurrency=2,
                on_episode=lambda pos, ep: seen.append(pos),
            )
    err = info.value
    assert sorted(err.finished) == seen == [0, 1] and err.pending == [2]
    assert all(ep.final_answer == "Ivofen" and len(ep.turns) == 2 for ep in err.episodes)
    assert "after 2 attempts" in str(err.__cause__)


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ValueError, match="base_urls"):
        OpenAIChatPolicy("m", "localhost:8000")
    with pytest.raises(ValueError, match="prefix_mode"):
        OpenAIChatPolicy("m", "http://127.0.0.1:1/v1", prefix_mode="force")  # type: ignore[arg-type]


# -- a real model server ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_server():
    """vLLM's OpenAI server on the embedded model, on a free loopback port (about a minute to start)."""
    with vllm_openai_servers(1) as (server,):
        yield server.url


@pytest.mark.slow
def test_contract_against_vllms_openai_server(vllm_server) -> None:
    with OpenAIChatPolicy("embedded", vllm_server, max_concurrency=4) as policy:
        check_contract(policy, chat_requests(4), max_new_tokens=12, check_order=False)


@pytest.mark.slow
def test_continue_mode_and_fixed_length_against_vllm(vllm_server, embedded) -> None:
    _, tokenizer = embedded
    request = GenerationRequest(messages=chat_requests(1)[0].messages, prefix="Alice:", key=(0,))
    sampling = SamplingParams(temperature=0.7, max_new_tokens=10, seed=5, ignore_eos=True)
    with OpenAIChatPolicy("embedded", vllm_server, prefix_mode="continue") as policy:
        first = policy.generate([request], sampling)
        assert policy.generate([request], sampling) == first  # seeded per request
    assert first[0].startswith("Alice:") and not first[0].startswith("Alice: Alice:")
    assert 8 <= len(tokenizer(first[0][len("Alice:") :], add_special_tokens=False)["input_ids"]) <= 12


@pytest.mark.slow
def test_rollout_through_vllms_server_counts_tokens_with_the_tokenizer(vllm_server, embedded) -> None:
    _, tokenizer = embedded
    task = make_task("ie/synth-v0")
    with OpenAIChatPolicy("embedded", vllm_server, prefix_mode="continue") as policy:
        episodes = rollout(
            task,
            policy,
            jobs=make_jobs(range(2), 2, seed=0),
            sampling=SamplingParams(temperature=0.7, max_new_tokens=24, seed=0),
            env_kwargs={"tokenizer": tokenizer, "max_turns": 2},
        )
    assert len(episodes) == 4
    for episode in episodes:
        for turn in episode.turns:
            assert turn.text.startswith(f"{turn.agent}:")
            assert turn.num_tokens == len(tokenizer.tokenize(turn.text))
