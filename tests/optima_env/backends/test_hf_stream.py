"""Continuous batching in the transformers backend: ``TransformersPolicy`` as a ``TurnEngine``.

A tiny randomly initialized Llama with the embedded model's tokenizer; replies of different
lengths come from per-request ``max_new_tokens`` (a random model rarely samples EOS).
"""

from __future__ import annotations

import pytest

from optima_env.errors import BackendError, TaskContractError
from optima_env.policy import GenerationRequest, SamplingParams, TurnEngine, request_seed
from tests.optima_env.backends.test_hf import conversation
from tests.tiny_model import tiny_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from optima_env.backends.hf import TransformersPolicy  # noqa: E402


def drain(engine: TurnEngine) -> tuple[dict[int, str], list[list[int]]]:
    """Poll until nothing is pending: replies by ticket, and the tickets each poll returned."""
    replies: dict[int, str] = {}
    polls: list[list[int]] = []
    while out := engine.poll():
        polls.append([ticket for ticket, _ in out])
        for ticket, reply in out:
            assert ticket not in replies
            replies[ticket] = reply
    return replies, polls


def test_streamed_replies_equal_generate_greedy_and_seeded_and_use_the_prefix_cache(tiny, tokenizer) -> None:
    # float32: the precision in which a request's text does not depend on its batch (precision.py)
    engine = TransformersPolicy(tiny, tokenizer, batch_size=3, precision="float32")
    assert isinstance(engine, TurnEngine) and engine.capacity == 3
    greedy = [SamplingParams(temperature=0, max_new_tokens=n) for n in (4, 9)]
    seeded = [SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=n, seed=7) for n in (5, 8)]
    kinds = greedy + seeded
    for turns in range(3):
        requests = [conversation(i, turns) for i in range(8)]
        for i, request in enumerate(requests):
            engine.submit(100 * turns + i, request, kinds[i % 4])
        replies, _ = drain(engine)
        for k, sampling in enumerate(kinds):
            group = list(range(k, 8, 4))
            reference = TransformersPolicy(
                tiny, tokenizer, batch_size=3, prefix_cache_mb=0, precision="float32"
            )
            expected = reference.generate([requests[i] for i in group], sampling)
            assert [replies[100 * turns + i] for i in group] == expected, (turns, sampling)
            assert all(reply.startswith("Alice:") for reply in expected)
    assert engine.prefix_cache is not None and len(engine.prefix_cache) > 0
    assert engine.stats.prefilled_tokens < engine.stats.prompt_tokens / 2
    assert engine.stats.requests == 24
    assert engine.poll() == []


def test_a_short_request_ends_first_and_a_late_one_joins_the_running_batch(tiny, tokenizer) -> None:
    engine = TransformersPolicy(tiny, tokenizer, batch_size=2)
    long, short = (SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True) for n in (20, 3))
    engine.submit(0, conversation(0, 1), long)
    engine.submit(1, conversation(1, 1), short)
    assert engine.poll() == [(1, engine_reply(tiny, tokenizer, 1, short))]
    engine.submit(2, conversation(2, 1), short)  # submitted while request 0 runs
    assert engine.poll() == [(2, engine_reply(tiny, tokenizer, 2, short))]
    assert engine.poll() == [(0, engine_reply(tiny, tokenizer, 0, long))]
    # one round per token of the long reply: the short ones ran beside it, not after it
    assert engine.stats.decode_steps == 20
    assert engine.stats.slot_steps == 40
    assert engine.stats.generated_tokens == 26


def engine_reply(tiny, tokenizer, i: int, sampling: SamplingParams) -> str:
    return TransformersPolicy(tiny, tokenizer).generate([conversation(i, 1)], sampling)[0]


def test_capacity_bounds_the_running_rows_and_slots_are_refilled_in_order(tiny, tokenizer) -> None:
    engine = TransformersPolicy(tiny, tokenizer, batch_size=2)
    lengths = [6, 2, 5, 3, 4]
    for ticket, n in enumerate(lengths):
        sampling = SamplingParams(max_new_tokens=n, ignore_eos=True, seed=1)
        engine.submit(ticket, conversation(ticket, 0), sampling)
    order = []
    while out := engine.poll():
        assert engine._stream.running <= engine.capacity
        order.extend(ticket for ticket, _ in out)
    # slots: 0 and 1; 2 takes 1's slot after round 2, 3 takes 0's after round 6, 4 takes 2's after round 7
    assert order == [1, 0, 2, 3, 4]
    assert engine.stats.decode_steps == 11
    assert engine.stats.generated_tokens == sum(lengths)
    assert engine.stats.slot_steps == 2 * 11


def test_the_kv_buffer_holds_rows_for_the_running_requests_not_for_every_slot(tiny, tokenizer) -> None:
    engine = TransformersPolicy(tiny, tokenizer, batch_size=32)
    long, short = (SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True) for n in (12, 3))
    engine.submit(0, conversation(0, 2), long)
    engine.submit(1, conversation(1, 2), short)
    first = engine.poll()
    assert [t for t, _ in first] == [1]
    assert engine._stream.buf.shape[2] == 2  # two requests ran: two rows, not 32
    for ticket in (2, 3, 4):  # three join the one still running: 4 rows needed, doubled from 2
        engine.submit(ticket, conversation(ticket, 2), short)
    replies = dict(first)
    replies.update(engine.poll())
    assert engine._stream.buf.shape[2] == 4
    replies.update(drain(engine)[0])
    assert sorted(replies) == [0, 1, 2, 3, 4]
    for ticket, sampling in ((0, long), (1, short), (3, short)):
        assert (
            replies[ticket]
            == TransformersPolicy(tiny, tokenizer).generate([conversation(ticket, 2)], sampling)[0]
        )


def kv_bytes_per_token(model, dtype) -> int:
    from optima_env.backends import _kv

    layers, kv_heads, head_dim = _kv.kv_geometry(model)
    return layers * 2 * kv_heads * head_dim * dtype.itemsize


def test_the_kv_budget_bounds_the_running_rows_and_a_lone_request_runs_over_it(tiny, tokenizer) -> None:
    sampling = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
    requests = [conversation(i, 2) for i in range(5)]
    probe = TransformersPolicy(tiny, tokenizer, prefix_cache_mb=0)
    most = max(len(p) for p in probe._encode(requests)) + sampling.max_new_tokens
    per_token = kv_bytes_per_token(tiny, probe.kv_dtype)
    budget = 2.5 * most * per_token  # two rows run to their cap fit, three do not
    engine = TransformersPolicy(tiny, tokenizer, batch_size=8, kv_cache_mb=budget / 2**20)
    for ticket, request in enumerate(requests):
        engine.submit(ticket, request, sampling)
    replies, running = {}, []
    while out := engine.poll():
        replies.update(out)
        stream = engine._stream
        running.append(stream.running)
        if stream.buf is not None:
            assert stream.buf[0, 0, :, 0, :, 0].numel() * per_token <= budget
    assert max(running) <= 2 and engine.stats.slot_steps == 8 * engine.stats.decode_steps
    assert engine.stats.decode_steps >= 3 * sampling.max_new_tokens  # 2 + 2 + 1 rows, one group after another
    assert [replies[i] for i in range(5)] == probe.generate(requests, sampling)
    lone = TransformersPolicy(tiny, tokenizer, batch_size=8, kv_cache_mb=most * per_token / 4 / 2**20)
    lone.submit(0, requests[0], sampling)
    assert lone.poll() == [(0, replies[0])]


def test_the_buffer_shrinks_to_the_rows_that_still_run(tiny, tokenizer) -> None:
    engine = TransformersPolicy(tiny, tokenizer, batch_size=8)
    stream = engine._stream
    shapes = []
    ensure = stream._ensure

    def recording(**kwargs):
        ensure(**kwargs)
        shapes.append((len(stream.rows), stream.buf.shape[2], stream.buf.shape[4]))

    stream._ensure = recording
    long, short = (SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True) for n in (200, 3))
    engine.submit(0, conversation(0, 1), long)
    for ticket in (1, 2, 3):
        engine.submit(ticket, conversation(ticket, 1), short)
    assert sorted(drain(engine)[0]) == [0, 1, 2, 3]
    assert shapes[0][:2] == (0, 4)  # four admitted: four rows
    # the long row alone, past the first columns: the buffer was reallocated with one row
    assert any(rows == 1 and slots == 1 for rows, slots, _ in shapes[1:])


def test_decode_buffers_are_freed_at_once_without_the_garbage_collector(tiny, tokenizer) -> None:
    """The cache layers wrapping a buffer must not sit in a reference cycle: with a class made per
    call they did, and every reallocated buffer lived until the next full collection."""
    import gc
    import weakref

    from optima_env.backends import _kv

    engine = TransformersPolicy(tiny, tokenizer, batch_size=4)
    seen = []
    sampling = SamplingParams(temperature=0, max_new_tokens=150, ignore_eos=True)
    gc.collect()
    gc.disable()
    try:
        buf = torch.zeros(2, 2, 1, 2, 8, 16)
        cache = _kv.BatchKV(buf, 0).cache()
        alone = weakref.ref(buf)
        del buf, cache
        assert alone() is None
        for ticket in range(3):
            engine.submit(ticket, conversation(ticket, 2), sampling)
        while engine.poll() or engine._stream.running:
            pass
        stream = engine._stream
        ensure = stream._ensure

        def recording(**kwargs):
            ensure(**kwargs)
            if not seen or seen[-1]() is not stream.buf:
                seen.append(weakref.ref(stream.buf))

        stream._ensure = recording
        for ticket in range(3):
            engine.submit(10 + ticket, conversation(ticket, 3), sampling)
        assert len(drain(engine)[0]) == 3
        assert len(seen) >= 2  # reallocated while running
        assert [ref() for ref in seen] == [None] * len(seen)  # nothing running: every buffer freed
    finally:
        gc.enable()


def test_generate_counts_slot_steps_on_both_paths(tiny, tokenizer) -> None:
    sampling = SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True)
    for fast in (True, False):
        policy = TransformersPolicy(tiny, tokenizer, batch_size=2, fast=fast)
        policy.generate([conversation(i, 0) for i in range(3)], sampling)
        # two batches (2 rows, then 1) of 5 rounds, 2 slots each: 15 tokens in 20 slot-steps
        stats = policy.stats
        assert (stats.decode_steps, stats.slot_steps, stats.generated_tokens) == (10, 20, 15)


def test_stop_strings_and_prefix_in_the_stream(tiny, tokenizer) -> None:
    request = conversation(1, 1)
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    continuation = TransformersPolicy(tiny, tokenizer).generate([request], greedy)[0][len("Alice:") :]
    stop = continuation[6:9]
    assert stop.strip(), f"pick another stop string from {continuation!r}"
    stopped = SamplingParams(temperature=0, max_new_tokens=16, stop=(stop,))
    engine = TransformersPolicy(tiny, tokenizer, batch_size=2)
    engine.submit(5, request, stopped)
    engine.submit(6, conversation(2, 1), greedy)
    replies, _ = drain(engine)
    assert replies[5] == "Alice:" + continuation[: continuation.find(stop)]
    assert engine.stats.generated_tokens < 32  # the stopped row left the batch early


def test_a_failure_raises_backend_error_and_drops_the_pending_requests(tiny) -> None:
    from optima_env.models import ensure_embedded_model

    strict = transformers.AutoTokenizer.from_pretrained(ensure_embedded_model())
    strict.chat_template = (
        "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
        "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
        "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    )
    engine = TransformersPolicy(tiny, strict, batch_size=2)
    sampling = SamplingParams(temperature=0, max_new_tokens=3)
    bad = GenerationRequest(messages=[{"role": "oracle", "content": "hi"}], prefix="Bob:")
    engine.submit(0, conversation(0, 0), sampling)
    engine.submit(1, bad, sampling)
    with pytest.raises(BackendError, match="unknown role oracle"):
        engine.poll()
    assert engine.poll() == []
    engine.submit(1, conversation(0, 0), sampling)  # the ticket is free again
    assert [ticket for ticket, _ in engine.poll()] == [1]
    with pytest.raises(TaskContractError, match="already pending"):
        engine.submit(2, conversation(0, 0), sampling)
        engine.submit(2, conversation(0, 0), sampling)


def test_models_off_the_fast_path_answer_through_generate(tokenizer) -> None:
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2)
    torch.manual_seed(0)
    engine = TransformersPolicy(transformers.GPT2LMHeadModel(config).eval(), tokenizer, batch_size=2)
    assert not engine.fast
    sampling = SamplingParams(temperature=0, max_new_tokens=4)
    requests = [conversation(i, 0) for i in range(3)]
    for ticket, request in enumerate(requests):
        engine.submit(ticket, request, sampling)
    replies, polls = drain(engine)
    assert polls == [[0, 1, 2]]
    assert [replies[t] for t in range(3)] == engine.generate(requests, sampling)


def test_rows_ending_at_eos_match_generate(tokenizer) -> None:
    requests = [conversation(i, 1) for i in range(6)]
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    for sampling in (greedy, SamplingParams(temperature=1.0, max_new_tokens=12, seed=5)):
        model = tiny_llama(tokenizer, tie_word_embeddings=False)
        probe = TransformersPolicy(model, tokenizer, prefix_cache_mb=0)
        seeds = [None if sampling.seed is None else request_seed(sampling.seed, r.key) for r in requests]
        rows = probe._decode(probe._encode(requests), seeds, sampling)
        # tokens the model writes mid-reply become end-of-sequence ids: replies of many lengths
        ends = {row[1 + r % 6] for r, row in enumerate(rows)}
        model.generation_config.eos_token_id = [tokenizer.eos_token_id, *ends]
        engine = TransformersPolicy(model, tokenizer, batch_size=3)
        for ticket, request in enumerate(requests):
            engine.submit(ticket, request, sampling)
        replies, polls = drain(engine)
        expected = TransformersPolicy(model, tokenizer, batch_size=3).generate(requests, sampling)
        assert [replies[t] for t in range(6)] == expected
        assert len({len(reply) for reply in expected}) > 2 and len(polls) > 2
