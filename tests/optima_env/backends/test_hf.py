"""The transformers backend: its fast decode loop against transformers' own ``generate``.

Fast tests use a tiny randomly initialized Llama with the embedded model's real tokenizer and
chat template; the slow ones use the embedded SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import numpy as np
import pytest

from optima_env.policy import GenerationRequest, SamplingParams
from tests.optima_env.backends.backend_contract import chat_requests, check_contract
from tests.tiny_model import tiny_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from optima_env.backends import _kv  # noqa: E402
from optima_env.backends.hf import TransformersPolicy  # noqa: E402


def conversation(i: int, turns: int) -> GenerationRequest:
    """Request ``i`` at turn ``turns``: instances 0-2 share system prompts, histories grow."""
    system = f"You are Alice. Instance {i % 3}. " + "fact " * (4 + 9 * (i % 3))
    messages = [{"role": "system", "content": system}]
    for t in range(turns):
        messages.append({"role": "assistant", "content": f"{'Bob' if t % 2 else 'Alice'}: turn {t} of {i}"})
    return GenerationRequest(messages=messages, prefix="Alice:", agent="Alice", key=(i, turns))


def test_fast_path_equals_transformers_generate_and_reuses_the_kv_cache(tiny, tokenizer) -> None:
    # float32: the precision in which a request's text does not depend on its batch (bf16 decode
    # rounds the batch shapes' last-bit differences into other tokens; optima_env.backends.precision)
    fast = TransformersPolicy(tiny, tokenizer, fast=True, batch_size=4, precision="float32")
    slow = TransformersPolicy(tiny, tokenizer, fast=False, batch_size=4, precision="float32")
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    for turns in range(3):
        requests = [conversation(i, turns) for i in range(7)]  # 7 rows, batches of 4: uneven lengths
        expected = slow.generate(requests, greedy)
        assert fast.generate(requests, greedy) == expected
        assert [fast.generate([r], greedy)[0] for r in requests] == expected
    assert fast.prefix_cache is not None and len(fast.prefix_cache) > 0
    assert fast.stats.prefilled_tokens < fast.stats.prompt_tokens / 2
    assert fast.stats.requests == slow.stats.requests * 2


def test_the_kv_cache_is_dropped_when_the_weights_change(tokenizer) -> None:
    model = tiny_llama(tokenizer, tie_word_embeddings=False)
    fast = TransformersPolicy(model, tokenizer, fast=True)
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    requests = [conversation(i, 2) for i in range(3)]
    before = fast.generate(requests, greedy)
    assert len(fast.prefix_cache) > 0
    with torch.no_grad():  # an optimizer step updates parameters in place like this
        model.model.layers[0].mlp.down_proj.weight.mul_(4.0)
        model.model.layers[1].self_attn.v_proj.weight.mul_(-2.0)
    after = fast.generate(requests, greedy)
    assert after == TransformersPolicy(model, tokenizer, fast=False).generate(requests, greedy)
    assert after != before


def test_seeded_sampling_does_not_depend_on_the_batch(tiny, tokenizer) -> None:
    """In fp32; bf16 linear layers round differently at other batch shapes (the precision docs)."""
    policy = TransformersPolicy(tiny, tokenizer, fast=True, precision="float32")
    sampling = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=10, seed=3)
    requests = [conversation(i, 1) for i in range(5)]
    together = policy.generate(requests, sampling)
    assert policy.generate(requests[::-1], sampling)[::-1] == together
    assert [policy.generate([r], sampling)[0] for r in requests] == together
    reseeded = policy.generate(
        requests, SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=10, seed=4)
    )
    assert reseeded != together


def test_ignore_eos_generates_exactly_max_new_tokens(tiny, tokenizer) -> None:
    for fast in (True, False):
        policy = TransformersPolicy(tiny, tokenizer, fast=fast)
        policy.generate(
            [conversation(i, 0) for i in range(3)], SamplingParams(max_new_tokens=9, ignore_eos=True)
        )
        assert policy.stats.generated_tokens == 27


def test_stop_strings_cut_the_reply_in_both_paths(tiny, tokenizer) -> None:
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    request = conversation(1, 1)
    full = TransformersPolicy(tiny, tokenizer, fast=False).generate([request], greedy)[0]
    continuation = full[len("Alice:") :]
    stop = continuation[6:9]
    assert stop.strip(), f"pick another stop string from {continuation!r}"
    expected = "Alice:" + continuation[: continuation.find(stop)]
    stopped = SamplingParams(temperature=0, max_new_tokens=16, stop=(stop,))
    for fast in (True, False):
        assert TransformersPolicy(tiny, tokenizer, fast=fast).generate([request], stopped) == [expected]


def test_contract_on_a_bf16_model(tokenizer) -> None:
    model = tiny_llama(tokenizer, tie_word_embeddings=False, dtype=torch.bfloat16)
    policy = TransformersPolicy(model, tokenizer)
    assert policy.fast
    check_contract(policy, chat_requests(5), max_new_tokens=6)


def test_unsupported_models_fall_back_to_generate(tokenizer) -> None:
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config).eval()
    policy = TransformersPolicy(model, tokenizer)
    assert not policy.fast
    with pytest.raises(ValueError, match="fast decode path supports"):
        TransformersPolicy(model, tokenizer, fast=True)


def test_prefix_cache_matches_supersedes_and_evicts() -> None:
    cache = _kv.PrefixCache(max_tokens=100, min_match=2)
    a = np.arange(40)
    cache.add(a[:30], "kv-30")
    entry, n = cache.lookup(np.concatenate([a[:20], [999]]))
    assert (entry.kv, n) == ("kv-30", 20)
    cache.add(a, "kv-40")  # extends the first entry, which is dropped
    assert len(cache) == 1 and cache.tokens == 40
    cache.add(np.arange(100, 150), "other")
    cache.add(np.arange(200, 230), "third")  # over budget: the least recently used goes
    assert cache.tokens <= 100 and cache.lookup(a)[1] == 0
    assert cache.lookup(np.arange(200, 210))[1] == 10
    assert cache.lookup(np.array([5, 6]))[0] is None


def test_shared_prefixes_are_found_once() -> None:
    rows = [
        np.array([1, 2, 3, 4, 5, 6]),
        np.array([1, 2, 3, 4, 9]),
        np.array([1, 2, 3, 4, 5, 7]),
        np.array([8, 8]),
    ]
    found = _kv.shared_prefixes(rows, [0, 0, 0, 0], min_gain=3)
    assert [p.tolist() for p in found] == [[1, 2, 3, 4, 5]]
    assert _kv.shared_prefixes(rows, [5, 4, 5, 0], min_gain=3) == []


def test_gather_columns_copies_what_index_select_gathers() -> None:
    states = torch.randn(2, 2, 3, 40, 4)
    for columns in ([], [7], [3, 4, 5], [0, 1, 2, 10, 11, 30, 35, 36, 37, 39]):
        index = torch.tensor(columns, dtype=torch.long)
        gathered = _kv.gather_columns(states, index)
        assert torch.equal(gathered, states.index_select(3, index))
        assert gathered.is_contiguous() and (not columns or gathered.data_ptr() != states.data_ptr())
        into = torch.zeros(2, 2, 3, len(columns) + 2, 4)[..., 1:-1, :]  # a view, as a buffer's row
        assert _kv.gather_columns(states, index, out=into) is into
        assert torch.equal(into, gathered)
    with pytest.raises(ValueError, match="hold the 3 columns the index selects, got 2"):
        _kv.gather_columns(states, torch.tensor([1, 2, 3]), out=torch.zeros(2, 2, 3, 2, 4))


def test_arena_hands_out_its_memory_again_and_grows_when_asked_for_more() -> None:
    arena = _kv.Arena()
    first = arena.take((2, 3, 4), torch.float32, torch.device("cpu"))
    first.fill_(1.0)
    again = arena.take((3, 4), torch.float32, torch.device("cpu"))
    assert again.shape == (3, 4) and again.data_ptr() == first.data_ptr()
    assert again.sum().item() == 12.0  # the memory is handed out as it was left, not cleared
    larger = arena.take((5, 6), torch.float32, torch.device("cpu"))
    assert larger.numel() == 30 and larger.data_ptr() != first.data_ptr()
    assert arena.take((2, 2), torch.bfloat16, torch.device("cpu")).dtype == torch.bfloat16
    arena.clear()
    assert arena.take((1,), torch.float32, torch.device("cpu")).numel() == 1


@pytest.mark.slow
def test_embedded_model_contract_and_agreement_with_generate(embedded) -> None:
    # fp32 is exact across batch shapes here; bf16 linear layers round their outputs to bf16,
    # so a greedy near tie may go either way when the batch's order or shape changes
    model, tokenizer = embedded
    fast = TransformersPolicy(model, tokenizer, precision="float32")
    assert fast.fast
    check_contract(fast, chat_requests(4), max_new_tokens=16)
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    requests = chat_requests(4)
    slow = TransformersPolicy(model, tokenizer, fast=False, precision="float32")
    assert fast.generate(requests, greedy) == slow.generate(requests, greedy)
    mixed = TransformersPolicy(model, tokenizer, precision="bfloat16")
    check_contract(mixed, chat_requests(4), max_new_tokens=16, check_order=False)
