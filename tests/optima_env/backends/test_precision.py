"""Decode precision of the transformers engine: bf16 linear layers where the CPU has native bf16,
fp32 elsewhere, the setting from the trainer config and the benchmark CLIs to the engine, and the
engine records that keep stores made under one engine from being taken for another's.

A tiny randomly initialized Llama with the embedded model's tokenizer; ``auto`` is checked on a CPU
without bf16 by faking the detection, not the engine.
"""

from __future__ import annotations

import json

import pytest

from optima_env.errors import DataError, TaskContractError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from optima_env.backends import precision  # noqa: E402
from optima_env.backends.hf import TransformersPolicy  # noqa: E402
from optima_env.backends.precision import Bf16Linears, resolve_precision  # noqa: E402
from tests.tiny_model import tiny_llama  # noqa: E402


def _forward(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


@pytest.mark.parametrize(("native", "resolved"), [(False, "float32"), (True, "bfloat16")])
def test_auto_decodes_in_bf16_only_where_the_cpu_has_it(tiny, tokenizer, monkeypatch, native, resolved):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    policy = TransformersPolicy(tiny, tokenizer)
    assert policy.precision == resolved
    mixed = {"mixed": precision.MIXED} if resolved == "bfloat16" else {}
    assert policy.engine == {"precision": resolved, "sampler": "cdf", **mixed}
    assert policy.kv_dtype == torch.float32  # the model's dtype, whatever the linear layers decode in
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    reference = _forward(tiny, ids)
    with policy.decoding():
        inside = tiny(input_ids=ids).logits
    assert torch.equal(inside, reference) == (resolved == "float32")
    assert resolve_precision("auto") == resolved
    assert resolve_precision("auto", dtype="bfloat16") == "bfloat16"  # a bf16 model: its own dtype
    assert resolve_precision("bfloat16", device="cuda") == "float32"  # a GPU model: its own dtype


def test_bf16_linears_compute_in_bf16_and_leave_the_model_as_it_was(tiny) -> None:
    ids = torch.tensor([[5, 6, 7, 8]])
    before = _forward(tiny, ids)
    weights = {name: p.detach().clone() for name, p in tiny.named_parameters()}
    layer = tiny.model.layers[0].mlp.down_proj
    x = torch.randn(3, layer.in_features)
    expected = torch.nn.functional.linear(x.bfloat16(), layer.weight.bfloat16()).float()
    linears = Bf16Linears(tiny)
    with torch.inference_mode(), linears.active():
        assert torch.equal(layer(x), expected)
        assert tiny.lm_head(torch.ones(1, 64)).dtype == torch.float32
    assert torch.equal(_forward(tiny, ids), before)  # forwards restored
    assert all(torch.equal(p, weights[name]) for name, p in tiny.named_parameters())
    assert "forward" not in layer.__dict__


def test_packed_bf16_weights_give_f_linear_results_bit_for_bit(tiny) -> None:
    """Where this torch packs bf16 weights for oneDNN, every linear layer and the LM head give
    ``F.linear``'s bf16 results at decode and prefill row counts, on strided inputs too (a
    prefill's last positions)."""
    from optima_env.backends.precision import _head_bf16, _Onednn

    linears = Bf16Linears(tiny)
    head = tiny.get_output_embeddings()
    layers = [m for m in tiny.modules() if isinstance(m, torch.nn.Linear)]
    if torch.backends.mkldnn.is_available() and precision.cpu_has_native_bf16():
        assert all(isinstance(linears._copy(m)[0], _Onednn) for m in layers)  # packed: checked below
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for module in layers:
            plain = module.weight.bfloat16()
            for shape in ((1, 1), (4, 1), (3, 33), (1, 300)):
                x = torch.randn(*shape, module.in_features, generator=generator)
                if module is head:
                    got = _head_bf16(head, *linears._copy(head), 0, x[:, -1:])
                    expected = torch.nn.functional.linear(x[:, -1:].bfloat16(), plain).float()
                else:
                    got = linears.forward_of(module)(x)
                    expected = torch.nn.functional.linear(x.bfloat16(), plain).float()
                assert got.shape == expected.shape and torch.equal(got, expected)


def test_packing_is_checked_once_per_weight_shape_and_holds_for_every_weight_of_it(tokenizer) -> None:
    """The bit-for-bit check of a packed weight runs per shape, bias and thread count (oneDNN's
    kernel choice), not per weight; every layer of a second model with the same shapes still
    gives ``F.linear``'s results."""
    if not (torch.backends.mkldnn.is_available() and precision.cpu_has_native_bf16()):
        pytest.skip("this CPU or torch packs no bf16 weights")
    precision._PACK_CHECKED.clear()
    first, second = (tiny_llama(tokenizer, seed=seed, tie_word_embeddings=False) for seed in (0, 1))
    layers = [m for m in first.modules() if isinstance(m, torch.nn.Linear)]
    with Bf16Linears(first).active():
        pass
    shapes = {(tuple(m.weight.shape), m.bias is not None, torch.get_num_threads()) for m in layers}
    assert set(precision._PACK_CHECKED) == shapes and len(shapes) < len(layers)
    assert all(precision._PACK_CHECKED.values())
    linears = Bf16Linears(second)
    generator = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for module in (m for m in second.modules() if isinstance(m, torch.nn.Linear)):
            x = torch.randn(5, module.in_features, generator=generator)
            expected = torch.nn.functional.linear(x.bfloat16(), module.weight.bfloat16()).float()
            assert torch.equal(linears.forward_of(module)(x), expected)
    assert set(precision._PACK_CHECKED) == shapes  # nothing new to check


def test_bf16_copies_follow_a_weight_update(tokenizer) -> None:
    model = tiny_llama(tokenizer, tie_word_embeddings=False)
    linears = Bf16Linears(model)
    layer = model.model.layers[1].self_attn.o_proj
    x = torch.randn(2, layer.in_features)
    with torch.inference_mode(), linears.active():
        first = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2.0)  # an optimizer step bumps the version counter the same way
    with torch.inference_mode(), linears.active():
        second = layer(x)
    assert torch.equal(second, torch.nn.functional.linear(x.bfloat16(), layer.weight.bfloat16()).float())
    assert not torch.equal(first, second)


def test_bad_settings_are_refused(tiny, tokenizer) -> None:
    with pytest.raises(TaskContractError, match="precision must be one of auto, float32, bfloat16"):
        TransformersPolicy(tiny, tokenizer, precision="fp16")
    with pytest.raises(TaskContractError, match="sampler must be one of cdf, multinomial"):
        TransformersPolicy(tiny, tokenizer, sampler="gumbel")


@pytest.mark.slow
def test_the_precision_reaches_the_engine_from_the_trainer_config(monkeypatch) -> None:
    from optima_env.backends.loading import load_policy
    from optima_env.configtree import ConfigError
    from tests.optima_trainers.generation.test_scale_switches import trainer_config

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    for setting, resolved in (("float32", "float32"), ("bfloat16", "bfloat16"), ("auto", "float32")):
        config = trainer_config("--backend", "hf", "--set", f"generation.precision={setting}")
        options = config.generation.policy_options()
        assert load_policy("embedded", backend="hf", batch_size=2, **options).precision == resolved
    assert trainer_config("--backend", "hf").generation.precision == "auto"
    legacy = trainer_config(
        "--backend", "hf", "--set", "generation.precision=float32", "--set", "generation.sampler=multinomial"
    )  # fmt: skip
    replay = load_policy("embedded", backend="hf", batch_size=2, **legacy.generation.policy_options())
    assert replay.engine == {"precision": "float32", "sampler": "multinomial"}
    with pytest.raises(ConfigError, match=r"generation.precision.*one of .auto., .float32., .bfloat16."):
        trainer_config("--backend", "hf", "--set", "generation.precision=half")


def test_the_precision_reaches_the_engine_from_the_benchmark_clis() -> None:
    from benchmarks.evaluation.policies import load_policy
    from benchmarks.run import RunConfigError, hf_options, parse_args
    from benchmarks.throughput import rollout_bench
    from benchmarks.throughput.rollout_engines import new_engine
    from optima_env.cli_support import dataclass_from_args

    args = parse_args(["--precision", "float32"])
    policy, _ = load_policy("embedded", backend="hf", batch_size=2, **hf_options(args, "hf"))
    assert policy.precision == "float32"
    assert hf_options(args, "vllm") == {}
    with pytest.raises(RunConfigError, match="--precision must be one of"):
        parse_args(["--precision", "int8"])
    ns = rollout_bench.build_parser().parse_args(["--precision", "bfloat16"])
    cfg = dataclass_from_args(rollout_bench.SuiteConfig, ns)
    assert new_engine(cfg) == {"precision": "bfloat16", "sampler": "cdf"}


def test_a_stage_folder_refuses_to_resume_under_another_engine(tiny, tokenizer, tmp_path) -> None:
    from optima_trainers.generation.engines import check_stage_engine

    fp32 = TransformersPolicy(tiny, tokenizer, precision="float32")
    bf16 = TransformersPolicy(tiny, tokenizer, precision="bfloat16")
    assert check_stage_engine(bf16, tmp_path) is bf16
    recorded = {"precision": "bfloat16", "sampler": "cdf", "mixed": precision.MIXED}
    assert json.loads((tmp_path / "engine.json").read_text()) == recorded
    assert check_stage_engine(bf16, tmp_path) is bf16
    with pytest.raises(DataError, match=r"generation\.precision=bfloat16 --set generation\.sampler=cdf"):
        check_stage_engine(fp32, tmp_path)
    (tmp_path / "engine.json").write_text(json.dumps({"precision": "bfloat16", "sampler": "cdf"}))
    with pytest.raises(DataError, match=f"mixed version {precision.MIXED} only"):  # the bf16 decode before
        check_stage_engine(bf16, tmp_path)
    old = tmp_path / "old"
    old.mkdir()
    (old / "episodes.jsonl").write_text("{}\n")  # episodes from before stage folders recorded engines
    with pytest.raises(DataError, match=r"episodes\.jsonl: no engine\.json beside it: run folder format 2"):
        check_stage_engine(fp32, old)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "episodes.rank1of2.jsonl").write_text("{}\n")  # a rank's shard of this run: no data yet
    assert check_stage_engine(fp32, fresh) is fp32
    assert json.loads((fresh / "engine.json").read_text()) == {"precision": "float32", "sampler": "cdf"}


def test_a_benchmark_store_never_mixes_engines(tiny, tokenizer, tmp_path) -> None:
    import dataclasses

    from benchmarks.evaluation.methods import PlaySettings, build_methods
    from benchmarks.evaluation.store import EpisodeStore
    from benchmarks.evaluation.units import TaskEntry, check_engine
    from tests.benchmarks.evaluation.test_methods import _episode

    settings = PlaySettings(max_turns=2, max_new_tokens=8)  # greedy: the sampler does not count
    method = build_methods(("mad",), {}, settings)[0]
    entry = TaskEntry(task="t/x-v0")
    store = EpisodeStore(tmp_path / "episodes.jsonl")
    meta = {"method": method.key, "instance": 0, "sample": 0}
    store.add(dataclasses.replace(_episode("a", 1.0), metadata=meta))  # no record: fp32 multinomial
    check_engine(method, entry, store, TransformersPolicy(tiny, tokenizer, precision="float32"), settings)
    with pytest.raises(DataError, match="rerun with --precision float32"):
        bf16 = TransformersPolicy(tiny, tokenizer, precision="bfloat16")
        check_engine(method, entry, store, bf16, settings)


def test_a_bf16_lm_head_gives_its_top_logits_as_fp32_does(tiny) -> None:
    from optima_env.backends.precision import EXACT_TOP

    head = tiny.lm_head
    x = torch.randn(3, head.in_features)
    with torch.inference_mode():
        reference = head(x)
        with Bf16Linears(tiny, lm_head=True).active():
            mixed = head(x)
        with Bf16Linears(tiny, lm_head=True, exact_top=0).active():
            plain = head(x)
    top = plain >= plain.topk(EXACT_TOP, dim=-1).values[:, -1:]  # by value: ties included
    assert (top.sum(-1) >= EXACT_TOP).all()
    assert torch.allclose(mixed[top], reference[top], atol=1e-5, rtol=1e-5)
    assert torch.equal(mixed[~top], plain[~top])  # the tail as bf16 gives it
    assert not torch.equal(plain, reference)
    assert torch.equal(mixed.argmax(-1), reference.argmax(-1))


def test_the_kv_states_keep_the_model_s_dtype_in_either_precision_and_attention_follows_their_dtype(
    tiny, tokenizer
) -> None:
    from optima_env.backends import _kv
    from optima_env.policy import SamplingParams
    from tests.optima_env.backends.test_hf import conversation

    sampling = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
    for setting in ("bfloat16", "float32"):
        policy = TransformersPolicy(tiny, tokenizer, precision=setting)
        policy.generate([conversation(0, 2), conversation(1, 2)], sampling)
        assert policy.kv_dtype == torch.float32
        assert policy.prefix_cache is not None and len(policy.prefix_cache) > 0
        assert {entry.kv.dtype for entry in policy.prefix_cache._entries} == {torch.float32}
    bf16_model = tiny_llama(tokenizer).to(torch.bfloat16)  # a bf16 model: its own dtype throughout
    assert TransformersPolicy(bf16_model, tokenizer).kv_dtype == torch.bfloat16
    query, key, value = torch.randn(2, 4, 3, 16), torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)
    mixed, _ = _kv.gqa_attention(None, query, key.bfloat16(), value.bfloat16(), None)
    reference, _ = _kv.gqa_attention(None, query, key, value, None)
    assert mixed.dtype == torch.float32
    assert torch.allclose(mixed, reference, atol=0.05) and not torch.equal(mixed, reference)


def test_prefill_chunks_hold_their_positions_and_give_the_unchunked_logits(tiny, tokenizer) -> None:
    from optima_env.backends import _kv
    from tests.optima_env.backends.test_hf import conversation

    assert _kv.prefill_chunks([100, 300, 200, 50, 60], 512) == [(0, 1), (1, 2), (2, 4), (4, 5)]
    assert _kv.prefill_chunks([600], 512) == [(0, 1)]  # a row longer than a chunk runs alone
    policy = TransformersPolicy(tiny, tokenizer, precision="float32", prefix_cache_mb=0)
    rows = policy._encode([conversation(i, 1 + i % 3) for i in range(5)])
    outs = []
    previous = _kv.PREFILL_TOKENS
    try:
        for tokens in (10**9, max(len(r) for r in rows)):  # one chunk, then about a row a chunk
            _kv.PREFILL_TOKENS = tokens
            with policy.decoding():
                outs.append(policy._prefill(rows, extra=0))
    finally:
        _kv.PREFILL_TOKENS = previous
    (_, whole, info), (_, chunked, chunked_info) = outs
    assert policy.stats.forward_passes > 2  # the second prefill ran in chunks
    assert torch.allclose(whole, chunked, atol=1e-4)
    assert torch.equal(info["valid"], chunked_info["valid"])


@pytest.mark.parametrize("tied", [3, 136])
def test_the_bf16_lm_head_recomputes_every_logit_tied_at_the_cut(tokenizer, tied) -> None:
    """``tied`` tokens share the row's k-th largest logit: all of them come out as fp32 gives them,
    not only those ``topk`` happens to return (bf16 logits tie often)."""
    from optima_env.backends.precision import EXACT_TOP

    model = tiny_llama(tokenizer, tie_word_embeddings=False)
    head = model.lm_head
    x = torch.randn(2, head.in_features, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        top = head(x)[0].topk(EXACT_TOP - 1).indices
        rest = [t for t in range(head.out_features) if t not in set(top.tolist())][:tied]
        head.weight[rest] = head.weight[top[-1]].clone()  # tied with row 0's 63rd largest logit
    with torch.inference_mode():
        reference = head(x)
        with Bf16Linears(model, exact_top=0).active():
            plain = head(x)
        with Bf16Linears(model).active():
            mixed = head(x)
    chosen = plain >= plain.topk(EXACT_TOP, dim=-1).values[:, -1:]
    assert int(chosen[0].sum()) >= EXACT_TOP - 1 + tied  # the ties are at row 0's cut
    assert torch.allclose(mixed[chosen], reference[chosen], atol=1e-5, rtol=1e-5)
    assert torch.equal(mixed[~chosen], plain[~chosen])


def test_fidelity_measures_each_variant_with_its_own_kv_dtype_against_the_fp32_forward(tiny) -> None:
    sequences = [list(range(3, 40)), list(range(50, 70))]
    report = precision.fidelity(tiny, sequences, temperature=0.7)
    assert report["positions"] == 57 and set(report["variants"]) == set(precision.FIDELITY_VARIANTS)
    variants = report["variants"]
    assert {k: report[k] for k in ("tv_mean", "tv_p99", "top_token_agreement")} == variants["engine"]
    for v in variants.values():
        assert 0 < v["tv_mean"] <= v["tv_p99"] < 0.5 and 0.5 < v["top_token_agreement"] <= 1
    assert variants["bf16_kv"] != variants["engine"]  # the same layers over a bf16 KV cache
    assert precision.FIDELITY_VARIANTS["engine"]["kv_cache"] == "float32"  # what the engine keeps


def test_an_engine_record_says_which_dtype_its_kv_states_were_in() -> None:
    kv = precision.recorded_kv_dtype
    assert kv({"precision": "bfloat16", "sampler": "cdf", "mixed": precision.MIXED}) == "float32"
    assert kv({"precision": "bfloat16", "sampler": "cdf", "mixed": 3}) == "float32"
    assert kv({"precision": "bfloat16", "sampler": "cdf", "mixed": 2}) == "bfloat16"  # version 2 kept bf16
    assert kv({"precision": "bfloat16", "sampler": "cdf", "mixed": 1}) == "float32"
    assert kv({"precision": "float32", "sampler": "cdf"}) == "float32"
    assert kv({"precision": "bfloat16", "sampler": "cdf"}) == "bfloat16"  # a bf16 model's own
