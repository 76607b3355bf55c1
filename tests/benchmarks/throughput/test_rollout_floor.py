"""The rollout suite's floor: the unit costs priced against what an engine row counted."""

from __future__ import annotations

import pytest

from benchmarks.throughput.rollout_floor import floor_of

UNITS = {
    "units": {
        "2": {
            "read_bytes_per_s": 1e9,
            "gemm": {
                "float32": {"decode_s": {"1": 0.01, "4": 0.02, "32": 0.10}, "prefill_s_per_token": 0.001},
                "bfloat16": {"decode_s": {"1": 0.005, "4": 0.01, "32": 0.05}, "prefill_s_per_token": 0.0005},
            },
            "sample": {"cdf": {"1": 0.001, "32": 0.004}, "multinomial": {"1": 0.002, "32": 0.04}},
        }
    },
    "kv_bytes_per_token": {"float32": 1000, "bfloat16": 500},
}
STATS = {
    "decode_forwards": 10,
    "decode_rows": 40,  # 4 rows a pass
    "decode_steps": 11,
    "generated_tokens": 44,
    "prefilled_tokens": 100,
    "valid_columns": 50_000,
}


def test_each_part_of_the_work_is_priced_at_its_unit_cost() -> None:
    floor = floor_of(STATS, {"precision": "float32", "sampler": "cdf"}, 2, UNITS)
    assert floor["decode_gemm_s"] == pytest.approx(10 * 0.02)
    assert floor["prefill_gemm_s"] == pytest.approx(100 * 0.001)
    assert floor["attention_s"] == pytest.approx(50_000 * 1000 / 1e9)
    assert floor["sampling_s"] == pytest.approx(11 * (0.001 + 0.003 * 3 / 31))  # 4 rows: between 1 and 32
    assert floor["floor_s"] == pytest.approx(sum(floor[k] for k in ("decode_gemm_s", "prefill_gemm_s", "attention_s", "sampling_s")))
    assert floor["floor_tokens_per_s"] == pytest.approx(44 / floor["floor_s"])


def test_the_row_s_precision_and_sampler_choose_the_units() -> None:
    fp32 = floor_of(STATS, {"precision": "float32", "sampler": "multinomial"}, 2, UNITS)
    bf16 = floor_of(STATS, {"precision": "bfloat16", "sampler": "cdf", "mixed": 3}, 2, UNITS)
    assert bf16["decode_gemm_s"] == pytest.approx(fp32["decode_gemm_s"] / 2)
    assert bf16["attention_s"] == pytest.approx(fp32["attention_s"])  # fp32 KV states
    assert bf16["sampling_s"] < fp32["sampling_s"]
    version_2 = floor_of(STATS, {"precision": "bfloat16", "sampler": "cdf", "mixed": 2}, 2, UNITS)
    assert version_2["attention_s"] == pytest.approx(fp32["attention_s"] / 2)  # kept them in bf16


def test_a_row_without_counters_or_measured_units_has_no_floor() -> None:
    assert floor_of({}, {"precision": "float32", "sampler": "cdf"}, 2, UNITS) == {}
    assert floor_of(STATS, {"precision": "float32", "sampler": "cdf"}, 1, UNITS) == {}  # 1 thread: not measured
    assert floor_of(STATS, {"precision": "float16", "sampler": "cdf"}, 2, UNITS) == {}
