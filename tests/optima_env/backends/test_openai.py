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

from optima_env import BackendError, TaskContractError, make_task
from optima_env.policy import GenerationRequest, SamplingParams, TurnEngine, request_seed
from optima_env.rollout import RolloutError, make_jobs, rollout
from tests.optima_env.backends.backend_contract import chat_requests, check_contract
from tests.optima_env.backends.vllm_server import vllm_openai_servers

httpx = pytest.importorskip("httpx")

from optima_env.backends.openai import OpenAIChatPolicy  # noqa: E402

SECRET = "sk-test-0123456789-very-secret"


class StubServer:
    """A real HTTP server on loopback whose behaviour per request is ``behave(n, body) -> action``.

    Actions: ``("ok", content)``, ``("status", code)``, ``("hang", seconds)``, ``("bad", raw body)``.
    """

    def __init__(self, behave, admin=None, port: int = 0) -> None:
        self.behave = behave
        self.admin = admin  # (method, path, body) -> (status, JSON-ready payload) for other paths
        self.admin_calls: list[tuple[str, str, dict | None]] = []
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                self._admin("GET", None)

            def _admin(self, method: str, body: dict | None) -> None:
                with stub.lock:
                    stub.admin_calls.append((method, self.path, body))
                code, payload = stub.admin(method, self.path, body) if stub.admin else (404, {"error": "no"})
                self._send(code, json.dumps(payload).encode())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not self.path.endswith("/chat/completions"):
                    self._admin("POST", body)
                    return
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

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
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
    # Every answer is "<A>Ivofen</A>", so an episode ends after 2 turns. The server fails every
    # request of the third conversation: a first turn (its prompt holds no earlier answer) after
    # two others. Decided by content, not arrival order: with 2 conversations in flight, the third
    # may start while the second's last turn is still on its way.
    served: set[str] = set()  # the first turns answered (the first two conversations')

    def dies(n, body):
        text = json.dumps(body, sort_keys=True)
        if "<A>Ivofen</A>" not in text and text not in served:
            if len(served) == 2:
                return ("status", 500)
            served.add(text)
        return ("ok", "<A>Ivofen</A>")

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
    assert sorted(err.finished) == sorted(seen) == [0, 1] and err.pending == [2]  # either may end first
    assert all(ep.final_answer == "Ivofen" and len(ep.turns) == 2 for ep in err.episodes)
    assert "after 2 attempts" in str(err.__cause__)


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ValueError, match="base_urls"):
        OpenAIChatPolicy("m", "localhost:8000")
    with pytest.raises(ValueError, match="prefix_mode"):
        OpenAIChatPolicy("m", "http://127.0.0.1:1/v1", prefix_mode="force")  # type: ignore[arg-type]


# -- sticky replicas ------------------------------------------------------------------------------
GREEDY = SamplingParams(temperature=0, max_new_tokens=4)


def conversation_turns(conversations: range, turn: int) -> list[GenerationRequest]:
    """Turn ``turn`` of each conversation ``i`` (session ``(i,)``; the server reads ``i`` from the
    system prompt)."""
    return [
        GenerationRequest(
            messages=[{"role": "system", "content": f"conversation {i}."}]
            + [{"role": "assistant", "content": f"turn {t}"} for t in range(turn)],
            prefix="Alice:",
            key=(i, turn),
            session=(i,),
        )
        for i in conversations
    ]


def served_by(*servers: StubServer) -> dict[int, list[str]]:
    """Conversation -> the servers that received its requests, in the order they first did."""
    out: dict[int, list[str]] = {}
    for server in servers:
        for body in server.requests:
            i = int(body["messages"][0]["content"].split()[1].rstrip("."))
            out.setdefault(i, [])
    for i in out:  # order by the turn number of the first request each server got
        firsts = []
        for server in servers:
            turns = [
                len(b["messages"])
                for b in server.requests
                if b["messages"][0]["content"] == f"conversation {i}."
            ]
            if turns:
                firsts.append((min(turns), server.url))
        out[i] = [url for _, url in sorted(firsts)]
    return out


def test_a_conversation_stays_on_one_replica_and_moves_only_when_its_replica_fails() -> None:
    from optima_env.backends.replicas import ReplicaSet

    conversations = range(24)
    with StubServer(echo) as a, StubServer(echo) as b:
        c = StubServer(echo).__enter__()
        port = c.server.server_address[1]
        urls = [a.url, b.url, c.url]
        # cooldown 0: a dead replica is tried again by each new request (and failed over at once)
        with fast_policy(urls, max_concurrency=4, max_retries=0, cooldown=0) as policy:
            for turn in range(2):
                policy.generate(conversation_turns(conversations, turn), GREEDY)
            home = {i: where[0] for i, where in served_by(a, b, c).items()}
            assert all(len(where) == 1 for where in served_by(a, b, c).values())  # sticky
            assert set(home.values()) == set(urls)  # spread over every replica
            assert policy.placements() == {(i,): (home[i],) for i in conversations}
            c.__exit__()  # killed: its conversations move, the others stay
            for turn in range(2, 4):
                policy.generate(conversation_turns(conversations, turn), GREEDY)
            revived = StubServer(echo, port=port).__enter__()  # back on the same address
            try:
                policy.generate(conversation_turns(conversations, 4), GREEDY)
                policy.generate(conversation_turns(range(24, 48), 0), GREEDY)  # new conversations
            finally:
                revived.__exit__()
            placements = policy.placements()
    moved = [i for i in conversations if home[i] == c.url]
    assert moved and len(moved) < len(conversations)
    for i in conversations:
        if home[i] != c.url:
            assert placements[(i,)] == (home[i],)  # never moved
        else:  # moved once, to a live replica, and stayed there after c came back
            assert len(placements[(i,)]) == 2 and placements[(i,)][1] in (a.url, b.url)
    later = [len(body["messages"]) for body in revived.requests]
    assert later and all(length == 1 for length in later)  # only new conversations' first turns
    again = ReplicaSet(urls, cooldown=0)  # another client (another process) maps them alike
    assert all(again.home((i,)) == home[i] for i in conversations)


def test_the_turn_engine_hands_back_each_reply_as_soon_as_it_is_done() -> None:
    release = threading.Event()

    def behave(n, body):
        if body["messages"][0]["content"].startswith("slow"):
            release.wait(30)
        return echo(n, body)

    slow = GenerationRequest(
        messages=[{"role": "system", "content": "slow one."}], prefix="Alice:", key=(1, 0)
    )
    quick = GenerationRequest(
        messages=[{"role": "system", "content": "quick one."}], prefix="Bob:", key=(2, 0)
    )
    sampling = SamplingParams(temperature=0.7, max_new_tokens=4, seed=3)
    with StubServer(behave) as server, fast_policy(server.url, max_concurrency=4) as policy:
        assert isinstance(policy, TurnEngine) and policy.capacity is None
        policy.submit(7, slow, sampling)
        policy.submit(3, quick, sampling)
        first = policy.poll()  # the slow reply cannot be done before `release`
        release.set()
        second = policy.poll()
        assert policy.poll() == []
        batch = policy.generate([slow, quick], sampling)
    assert first == [(3, batch[1])] and second == [(7, batch[0])]  # same text through generate
    assert batch[0].endswith(f"(seed {request_seed(3, (1, 0))})")  # seeded per request


def test_a_failed_turn_raises_from_poll_and_drops_the_pending_ones() -> None:
    release = threading.Event()

    def behave(n, body):
        if body["messages"][0]["content"].startswith("bad"):
            return "status", 400
        release.wait(30)
        return echo(n, body)

    def request(text: str) -> GenerationRequest:
        return GenerationRequest(messages=[{"role": "system", "content": text}], prefix="Alice:")

    with StubServer(behave) as server, fast_policy(server.url, max_concurrency=4) as policy:
        policy.submit(1, request("waits."), GREEDY)
        policy.submit(2, request("bad."), GREEDY)
        with pytest.raises(BackendError, match=r"1 pending requests dropped.*HTTP 400"):
            policy.poll()
        release.set()
        assert policy.poll() == []
        with pytest.raises(TaskContractError, match="already pending"):
            policy.submit(5, request("waits."), GREEDY)
            policy.submit(5, request("waits."), GREEDY)


class LoraServer(StubServer):
    """A stub with vLLM's runtime-LoRA endpoints: it serves ``base`` and the adapters loaded."""

    def __init__(self, refuses: bool = False) -> None:
        self.loaded: set[str] = set()
        self.refuses = refuses

        def chat(n, body):
            if body["model"] != "base" and body["model"] not in self.loaded:
                return "status", 404
            return "ok", f"{body['model']} says hi"

        super().__init__(chat, admin=self.endpoints)

    def endpoints(self, method: str, path: str, body: dict | None) -> tuple[int, object]:
        if method == "GET" and path == "/v1/models":
            return 200, {
                "data": [{"id": "base", "parent": None}] + [{"id": n, "parent": "base"} for n in self.loaded]
            }
        if path == "/v1/load_lora_adapter" and not self.refuses:
            if body["lora_name"] in self.loaded:
                return 400, {"message": f"The lora adapter '{body['lora_name']}' has already been loaded."}
            self.loaded.add(body["lora_name"])
            return 200, "Success"
        if path == "/v1/unload_lora_adapter" and body["lora_name"] in self.loaded:
            self.loaded.discard(body["lora_name"])
            return 200, "Success"
        return 404, {"detail": "Not Found"}

    def loads(self) -> list[tuple[str, str]]:
        return [
            (b["lora_name"], b["lora_path"])
            for m, p, b in self.admin_calls
            if p.endswith("/load_lora_adapter")
        ]


def test_serve_loads_the_adapter_on_every_replica_and_again_on_one_that_restarted() -> None:
    with LoraServer() as a, LoraServer() as b, fast_policy([a.url, b.url], max_concurrency=4) as policy:
        assert policy.served_base_model() == "base"
        policy.serve("optima-1", adapter="/runs/r/iter_00/checkpoint-server-lora")
        assert a.loaded == b.loaded == {"optima-1"}
        first = policy.generate(conversation_turns(range(16), 0), GREEDY)
        b.loaded.clear()  # b restarted: it serves the base model only
        second = policy.generate(conversation_turns(range(16), 1), GREEDY)
        assert b.loaded == {"optima-1"} and len(a.loads()) == 1  # loaded again (by each request that got 404)
        assert len(b.loads()) >= 2 and set(b.loads()) == {
            ("optima-1", "/runs/r/iter_00/checkpoint-server-lora")
        }
        policy.serve("optima-2", adapter="/runs/r/iter_01/checkpoint-server-lora")
        assert a.loaded == b.loaded == {"optima-2"}  # the previous adapter was unloaded
        policy.serve("base")
        assert policy.generate(conversation_turns(range(2), 0), GREEDY) == ["Alice: base says hi"] * 2
    assert first == second == ["Alice: optima-1 says hi"] * 16
    assert {r["model"] for r in a.requests[:8] + b.requests[:8]} == {"optima-1"}
    assert policy.placements() == {(0,): (policy._replicas.home((0,)),), (1,): (policy._replicas.home((1,)),)}


def test_a_server_without_runtime_lora_is_a_clear_error() -> None:
    with LoraServer(refuses=True) as server, fast_policy(server.url) as policy:
        with pytest.raises(
            BackendError, match=r"refused to load the LoRA adapter.*--enable-lora.*VLLM_ALLOW_RUNTIME"
        ):
            policy.serve("optima-1", adapter="/runs/adapter")
    with fast_policy([closed_port_url()], connect_timeout=0.3) as policy:
        with pytest.raises(BackendError, match=r"no replica .* answered to load the LoRA"):
            policy.serve("optima-1", adapter="/runs/adapter")


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
