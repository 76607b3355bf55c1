"""``--suite loop`` end to end on a tiny random model: both engines, per phase, resumable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.bench_helpers import assert_png

pytestmark = pytest.mark.slow

SIZES = {
    "generation.instances": 2, "generation.num_samples": 2, "generation.max_turns": 2,
    "generation.max_new_tokens": 8, "selection.theta": -100.0, "sft.max_steps": 1, "dpo.max_steps": 1,
    "tree.instances": 2, "tree.selections": 2, "tree.rollouts": 2, "tree.normalizer_instances": 2,
    "tree.theta_filter": -100.0, "tree.theta_diff": 0.0,
}  # fmt: skip
"""An iteration small enough for a test: every phase still runs, on a tiny random model."""


def test_the_loop_suite_times_both_engines_per_phase_and_resumes(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from benchmarks.throughput.loop_bench import run_loop_suite
    from tests.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    out = tmp_path / "loop"
    results = run_loop_suite(out, model=str(model), sizes=SIZES)
    measured = {(r["backend"], r["trainer"]): r for r in results["rows"] if r["measured"]}
    assert set(measured) == {(b, t) for b in ("hf_old", "hf") for t in ("isft", "idpo")}
    assert {"generate", "score", "select", "train"} <= set(measured[("hf_old", "isft")]["phases"])
    assert {"normalizer", "mcts", "train"} <= set(measured[("hf", "idpo")]["phases"])
    assert measured[("hf", "idpo")]["stage"] == "iter_01"
    assert {"one isft iteration (iter_00), end to end", "one idpo iteration (iter_01), end to end"} <= set(
        results["speedups"]
    )
    old = json.loads((out / "hf_old" / "isft" / "config.json").read_text())["generation"]
    assert (old["precision"], old["sampler"]) == ("float32", "multinomial")
    assert results["sft"]["sft_alone_s"] > 0 and results["sft"]["examples"] > 0
    table = (out / "results.md").read_text()
    assert "| speedup (the engine before / today's transformers engine, time, same run) | value |" in table
    assert_png(out / "loop.png")
    again = run_loop_suite(out, model=str(model), sizes=SIZES)  # resumes: nothing generated or trained again
    assert again["rows"] == results["rows"] and again["sft"] == results["sft"]
