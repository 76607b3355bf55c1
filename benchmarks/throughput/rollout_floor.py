"""The rollout suite's floor (:mod:`benchmarks.throughput.rollout_bench`, phase ``floor``): the least
time the transformers engine's work could take on this machine, counted from what the engine did.

The ``gemm`` phase's limit times each linear shape alone with a cached weight and leaves out
prefill, attention and sampling, which on the fixed-length workload take about as long as the
decode GEMMs; a share of it reads as headroom that is not there. The floor instead prices every
part of the work the engine counted (:class:`~optima_env.backends.hf.DecodeStats`) at a rate
measured here, for the engine's own precision, sampler and torch threads:

* **decode GEMMs**: every linear layer of the real model, the LM head included (its weights, in
  model order, in the engine's precision: where it decodes in bf16, its bf16 copies through its own
  matmul, oneDNN-packed where it packs them), fed a batch of the engine's mean decode batch, once
  per decode forward pass;
* **prefill GEMMs**: the same layers but the LM head (prefill keeps one row of logits) on 256
  tokens at once, per prefilled token;
* **attention**: the KV columns the rows' masks allow (padding left out), in the engine's KV dtype
  (its record's: :func:`~optima_env.backends.precision.recorded_kv_dtype`), read once per decode
  pass at the measured memory read rate (a sum over a 256 MB buffer);
* **sampling**: the engine's sampler on a batch of logits of the vocabulary's width, once per
  sampling round.

Everything else (norms, rotary embeddings, the attention of prefill, the bf16 LM head's fp32
recomputation of its top logits, KV copies, Python) counts as
zero, so the floor is a lower bound of the time: a row at 100% of its floor could not be faster
without doing less work (fewer prefilled tokens, fewer weight bytes). Rows report
``floor_tokens_per_s`` (generated tokens over the floor's seconds) and ``of_floor`` (their tokens/s
over it), beside ``of_gemm_limit``.

The phase also times torch's attention kernel alone, one layer of a decode step over
:data:`ATTENTION_COLUMNS` KV columns in fp32 and in bf16 (``attention_layer_s``): the measurement
behind the engine's fp32 KV cache (:mod:`optima_env.backends.precision`).
"""

from __future__ import annotations

import time
from typing import Any

from optima_env.backends.precision import recorded_kv_dtype

__all__ = ["ATTENTION_COLUMNS", "BATCHES", "floor_of", "run_floor_phase"]

BATCHES = (1, 2, 4, 8, 16, 32, 64)
"""Decode batches the unit costs are measured at (a row's mean batch is interpolated between)."""

ATTENTION_COLUMNS = 512
"""KV columns of the attention kernel's timing (about the fixed-length workload's last turn)."""

_PREFILL_TOKENS = 256
_READ_BYTES = 256 * 2**20


def _best(fn: Any, trials: int = 5, least_s: float = 0.05) -> float:
    """Seconds of one call of ``fn``: the best of ``trials`` runs of at least ``least_s`` each."""
    fn()
    best = float("inf")
    for _ in range(trials):
        calls, started = 0, time.perf_counter()
        while calls < 2 or time.perf_counter() - started < least_s:
            fn()
            calls += 1
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def _gemm_seconds(model: Any, precision: str, batch: int, *, lm_head: bool) -> float:
    """Seconds of every linear layer of ``model`` in model order on ``batch`` rows, in ``precision``
    (bf16: the engine's own path, :meth:`~optima_env.backends.precision.Bf16Linears.forward_of`,
    the input cast at each layer and the output cast back)."""
    import torch

    from optima_env.backends.precision import Bf16Linears

    linears = Bf16Linears(model)
    head = model.get_output_embeddings()
    layers = []
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or (module is head and not lm_head):
            continue
        forward = module.forward if precision == "float32" else linears.forward_of(module)
        layers.append((forward, torch.randn(batch, module.in_features)))

    def run() -> None:
        for forward, x in layers:
            forward(x)

    return _best(run)


def _read_rate() -> float:
    """Bytes per second of one streaming read (a sum) over a buffer far larger than the caches."""
    import torch

    buf = torch.ones(_READ_BYTES // 4, dtype=torch.float32)
    return _READ_BYTES / _best(lambda: buf.sum(), trials=5, least_s=0.2)


def _attention_seconds(model: Any, dtype: str, batch: int) -> float:
    """Seconds of one layer's decode attention (the engine's kernel, grouped KV heads) for ``batch``
    rows over :data:`ATTENTION_COLUMNS` columns of a ``dtype`` KV buffer (a view, as the engine's)."""
    import torch

    from optima_env.backends.hf import gqa_attention, kv_geometry

    _, kv_heads, head_dim = kv_geometry(model)
    heads = model.config.num_attention_heads
    generator = torch.Generator().manual_seed(0)
    buf = torch.randn(2, batch, kv_heads, ATTENTION_COLUMNS + 64, head_dim, generator=generator)
    buf = buf.to(getattr(torch, dtype))
    keys, values = buf[0, :, :, :ATTENTION_COLUMNS], buf[1, :, :, :ATTENTION_COLUMNS]
    query = torch.randn(batch, heads, 1, head_dim, generator=generator)
    mask = torch.zeros(batch, 1, 1, ATTENTION_COLUMNS)
    return _best(lambda: gqa_attention(None, query, keys, values, mask, scaling=head_dim**-0.5))


def _sample_seconds(vocab: int, batch: int, sampler: str, temperature: float) -> float:
    import torch

    from optima_env.backends.hf import sample_next
    from optima_env.policy import SamplingParams

    logits = torch.randn(batch, vocab) * 4
    sampling = SamplingParams(temperature=temperature, max_new_tokens=1, seed=0)
    generators = [torch.Generator().manual_seed(b) for b in range(batch)]
    return _best(lambda: sample_next(logits.clone(), sampling, generators, None, sampler))


def run_floor_phase(cfg: Any) -> dict[str, Any]:
    """Unit costs per precision, sampler and thread count the suite's rows run with."""
    import torch

    from optima_env.backends.hf import kv_bytes_per_token
    from optima_env.backends.precision import resolve_precision
    from optima_env.models import load_model

    model, _ = load_model(cfg.model, dtype="float32")
    precisions = sorted({"float32", resolve_precision(cfg.precision)})
    units: dict[str, Any] = {}
    with torch.inference_mode():
        for threads in sorted({cfg.threads, cfg.eos_threads}):
            torch.set_num_threads(threads)
            per = units[str(threads)] = {"read_bytes_per_s": _read_rate(), "gemm": {}, "sample": {}}
            batches = (cfg.eos_concurrency, cfg.concurrency)
            per["attention_layer_s"] = {
                dtype: {str(b): _attention_seconds(model, dtype, b) for b in batches}
                for dtype in ("float32", "bfloat16")
            }
            for precision in precisions:
                per["gemm"][precision] = {
                    "decode_s": {str(b): _gemm_seconds(model, precision, b, lm_head=True) for b in BATCHES},
                    "prefill_s_per_token": _gemm_seconds(model, precision, _PREFILL_TOKENS, lm_head=False)
                    / _PREFILL_TOKENS,
                }
            vocab = model.get_output_embeddings().out_features
            for sampler in ("cdf", "multinomial"):
                per["sample"][sampler] = {
                    str(b): _sample_seconds(vocab, b, sampler, cfg.temperature) for b in BATCHES
                }
    return {
        "units": units,
        "kv_bytes_per_token": {
            p: kv_bytes_per_token(model, getattr(torch, p)) for p in ("float32", "bfloat16")
        },
        "backend": "unit costs of the engine's work: real weights, memory read rate, sampler",
    }


def _at(table: dict[str, float], batch: float) -> float:
    """``table`` (seconds by batch) linearly interpolated at ``batch`` (clamped to its range)."""
    points = sorted((int(b), s) for b, s in table.items())
    if batch <= points[0][0]:
        return points[0][1]
    for (b0, s0), (b1, s1) in zip(points, points[1:]):
        if batch <= b1:
            return s0 + (s1 - s0) * (batch - b0) / (b1 - b0)
    return points[-1][1] * batch / points[-1][0]


def floor_of(stats: dict[str, int], engine: dict[str, str], threads: int, floor: dict[str, Any]) -> dict[str, Any]:
    """The floor of one row's work: seconds per part and generated tokens per second.

    ``stats`` are the engine's :class:`~optima_env.backends.hf.DecodeStats` fields, ``engine`` its
    record (precision, sampler), ``threads`` its torch threads, ``floor`` the ``floor`` phase's row.
    """
    units = floor["units"].get(str(threads))
    precision = engine.get("precision", "")
    gemm = units and units["gemm"].get(precision)
    sample = units and units["sample"].get(engine.get("sampler", ""), units["sample"]["cdf"])
    passes, rounds = stats.get("decode_forwards", 0), stats.get("decode_steps", 0)
    if not gemm or not passes or not rounds:
        return {}
    rows_per_pass = stats["decode_rows"] / passes
    rows_per_round = stats["generated_tokens"] / rounds
    parts = {
        "decode_gemm_s": passes * _at(gemm["decode_s"], rows_per_pass),
        "prefill_gemm_s": stats["prefilled_tokens"] * gemm["prefill_s_per_token"],
        "attention_s": stats["valid_columns"]
        * floor["kv_bytes_per_token"][recorded_kv_dtype(engine)]
        / units["read_bytes_per_s"],
        "sampling_s": rounds * _at(sample, rows_per_round),
    }
    seconds = sum(parts.values())
    return {**parts, "floor_s": seconds, "floor_tokens_per_s": stats["generated_tokens"] / seconds}
