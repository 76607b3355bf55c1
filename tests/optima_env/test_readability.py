"""The readability scorer's memory shape: token-budget batches and chunked LM-head loss,
checked against a plain full-logits fp32 reference (spec §3) on real models."""

from __future__ import annotations

import pytest

from optima_env.errors import ScoringError
from optima_env.readability import TransformersLMLoss, budget_batches, turn_template

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TURNS = [
    "Bob: ok",
    "Alice: The capital of France is Paris.",
    "Alice: Paris capital the France of is zq xv.",
    "Bob: I know that the company was founded in Rome by Carol, who speaks Italian and French. " * 3,
    "  Carol: <A>Rome</A>  ",
]


def reference_losses(model, tokenizer, texts) -> list[float]:
    """Spec §3 written out plainly: each turn alone, full logits upcast to fp32, the mean
    cross-entropy of the content tokens and the end marker (the prefix is not scored)."""
    prefix, scored, rest = turn_template(tokenizer)
    out = []
    for text in texts:
        content = text.strip()
        enc = tokenizer(
            prefix + content + scored + rest, add_special_tokens=False, return_offsets_mapping=True
        )
        ids = torch.tensor([enc["input_ids"]])
        start, end = len(prefix), len(prefix) + len(content) + len(scored)
        mask = torch.tensor([start <= lo < end for lo, _ in enc["offset_mapping"]])
        with torch.inference_mode():
            logits = model(input_ids=ids).logits.float()[0]
        per_token = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="none")
        out.append(float(per_token[mask[1:]].mean()))
    return out


class _Batches:
    """Records the shape of every batch the decoder is given."""

    def __init__(self, model) -> None:
        self.shapes: list[tuple[int, int]] = []
        self._handle = model.get_decoder().register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs) -> None:
        self.shapes.append(tuple(kwargs["input_ids"].shape))

    def close(self) -> None:
        self._handle.remove()


@pytest.mark.slow
def test_losses_equal_the_full_logits_reference_across_a_split_batch(embedded) -> None:
    model, tokenizer = embedded
    expected = reference_losses(model, tokenizer, TURNS)
    prefix, scored_suffix, rest = turn_template(tokenizer)
    rendered = [prefix + t.strip() + scored_suffix + rest for t in TURNS]
    lengths = sorted(len(ids) for ids in tokenizer(rendered, add_special_tokens=False)["input_ids"])
    budget = 3 * lengths[2]  # the three shortest turns fit one batch; the two longest do not
    scorer = TransformersLMLoss(model, tokenizer, max_batch_tokens=budget, chunk_tokens=7)
    batches = _Batches(model)
    try:
        got = scorer(TURNS)
    finally:
        batches.close()
    assert got == pytest.approx(expected, abs=1e-5)
    scored = batches.shapes[2:]  # the first call starts with the head check's two passes
    assert [rows for rows, _ in scored] == [3, 1, 1]
    assert all(rows * width <= budget for rows, width in scored[:1])
    assert scored[-1][1] > budget  # a turn over the budget is scored alone, whole
    assert scorer(TURNS[1:2]) == pytest.approx(got[1:2], abs=1e-5)  # batching does not change a loss


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory):
    from tests.tiny_model import make_tiny_model

    folder = make_tiny_model(tmp_path_factory.mktemp("tiny"))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    return model, transformers.AutoTokenizer.from_pretrained(folder)


class _LargestFloat32(torch.utils._python_dispatch.TorchDispatchMode):
    """The element count of the largest fp32 tensor any op produces while active."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.largest = max(self.largest, t.numel())
        return out


def test_a_bf16_model_is_scored_in_chunks_without_full_vocabulary_fp32_logits(tiny_bf16) -> None:
    model, tokenizer = tiny_bf16
    vocab = model.get_output_embeddings().weight.shape[0]
    head_rows: list[tuple[int, torch.dtype]] = []
    handle = model.get_output_embeddings().register_forward_hook(
        lambda m, a, out: head_rows.append((out.shape[:-1].numel(), out.dtype))
    )
    scorer = TransformersLMLoss(model, tokenizer, chunk_tokens=4)
    try:
        with _LargestFloat32() as spy:
            got = scorer(TURNS)
    finally:
        handle.remove()
    content_tokens = sum(rows for rows, _ in head_rows[2:])  # after the head check's two passes
    assert content_tokens > 40  # so a whole-batch fp32 logits tensor would be 10x the bound below
    assert 0 < spy.largest <= 4 * vocab  # one chunk's fp32 logits at most
    assert all(dtype == torch.bfloat16 for _, dtype in head_rows)
    assert all(rows <= 4 for rows, _ in head_rows[2:])
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # the weights stay bf16
    # bf16 logits of a chunk and of the whole sequence round apart (measured: 1.1e-5 relative)
    assert got == pytest.approx(reference_losses(model, tokenizer, TURNS), rel=1e-4)


def test_a_head_with_a_final_soft_cap_is_scored_through_the_models_own_logits(tiny_bf16) -> None:
    _, tokenizer = tiny_bf16
    config = transformers.Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, final_logit_softcapping=0.5,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config).eval()
    scorer = TransformersLMLoss(model, tokenizer, chunk_tokens=5)
    got = scorer(TURNS)
    assert scorer._plain_head is False  # the soft-cap was seen: the plain head would be wrong
    assert got == pytest.approx(reference_losses(model, tokenizer, TURNS), abs=1e-5)


def test_budget_batches_pack_sorted_lengths_within_the_budget() -> None:
    lengths = [2, 3, 3, 5, 5, 5, 8, 30]
    groups = budget_batches(lengths, 16)
    assert groups == [
        [0, 1, 2],
        [3, 4, 5],
        [6],
        [7],
    ]  # 4x5 = 20 > 16 closes the first; 4x8 and 2x30 do not fit
    assert [i for g in groups for i in g] == list(range(len(lengths)))
    assert budget_batches(lengths, 1000) == [list(range(len(lengths)))]
    assert budget_batches([], 16) == []


def test_bad_settings_and_unscorable_turns_are_refused(tiny_bf16) -> None:
    model, tokenizer = tiny_bf16
    for bad in ({"max_batch_tokens": 0}, {"max_length": "64"}, {"chunk_tokens": -1}):
        with pytest.raises(ScoringError, match="must be an int >= 1"):
            TransformersLMLoss(model, tokenizer, **bad)
    with pytest.raises(ScoringError, match="turn 0 has no content tokens to score"):
        TransformersLMLoss(model, tokenizer, max_length=2)(["Bob: ok"])
    assert TransformersLMLoss(model, tokenizer)([]) == []


def test_a_peft_wrapped_model_is_scored_with_its_adapter(tmp_path) -> None:
    peft = pytest.importorskip("peft")
    from tests.tiny_model import make_tiny_model

    folder = make_tiny_model(tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    base = transformers.AutoModelForCausalLM.from_pretrained(folder)
    plain = TransformersLMLoss(base, tokenizer)(TURNS)
    torch.manual_seed(0)
    config = peft.LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    model = peft.get_peft_model(base, config)
    got = TransformersLMLoss(model, tokenizer)(TURNS)
    assert got == pytest.approx(reference_losses(model, tokenizer, TURNS), abs=1e-5)
    assert max(abs(a - b) for a, b in zip(got, plain)) > 1e-3  # the adapter was applied
