"""Per-request sampling on the ``model.generate`` path: a reply does not depend on its batch."""

from __future__ import annotations

import pytest

from optima_env.policy import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def gpt2_policy():
    """A tiny random GPT-2 (outside the backend's fast path) with the embedded tokenizer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from optima_env.backends.keyed import KeyedSamplingPolicy
    from optima_env.models import ensure_embedded_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(ensure_embedded_model())
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=1024,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    policy = KeyedSamplingPolicy(model, tokenizer, batch_size=8)
    assert not policy.fast
    return policy


def request(text: str, key: tuple) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "system", "content": "You are Alice."}, {"role": "assistant", "content": text}],
        prefix="Alice:",
        agent="Alice",
        key=key,
    )


def test_reply_is_the_same_alone_or_in_any_batch(gpt2_policy) -> None:
    sampling = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=12, seed=7)
    target = request("Bob: where?", (11, 1))
    others = [
        request("Bob: a much longer message that pads the batch differently", (12, 1)),
        request("hi", (13, 1)),
    ]
    alone = gpt2_policy.generate([target], sampling)[0]
    batched = gpt2_policy.generate([others[0], target, others[1]], sampling)
    assert batched[1] == alone and alone.startswith("Alice:")
    assert (
        gpt2_policy.generate([target], SamplingParams(temperature=0.8, max_new_tokens=12, seed=8))[0] != alone
    )
    same_prompt_other_key = gpt2_policy.generate([request("Bob: where?", (11, 2))], sampling)[0]
    assert same_prompt_other_key != alone
