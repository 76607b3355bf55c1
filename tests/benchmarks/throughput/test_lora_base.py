"""The one-engine design comparison (``benchmarks.throughput.lora_base``): its GPU memory arithmetic,
its argument errors, and its committed table. No engine starts here (the run takes minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.throughput.lora_base import main
from benchmarks.throughput.lora_base_report import VLLM_RANKS, memory_arithmetic, report

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "lora_base"


def test_adapters_on_the_base_leave_one_model_copy_and_more_kv_cache_than_a_scorer_beside() -> None:
    memory = memory_arithmetic(cards_gb=(80.0, 141.0), stages=(1, 7))
    assert memory["weights_gb"] == pytest.approx(16.06, abs=0.01)  # Llama-3-8B in bf16
    for card in memory["cards"]:
        in_place = card["in_place"]
        assert in_place["model_copies_gb"] == pytest.approx(memory["weights_gb"] + in_place["scorer_gb"])
        assert in_place["scorer_gb"] == pytest.approx(16.75, abs=0.01)  # the memory plan's scorer
        for lora in card["lora_base"]:
            assert lora["scorer_gb"] == 0.0
            assert lora["model_copies_gb"] == pytest.approx(memory["weights_gb"] + lora["lora_slots_gb"])
            assert lora["utilization"] > in_place["utilization"]
            assert lora["kv_tokens"] > in_place["kv_tokens"]
    assert [c["in_place"]["utilization"] for c in memory["cards"]] == [0.78, 0.87]  # the plan's fitted values


def test_the_stacked_rank_rounds_up_to_a_rank_vllm_accepts() -> None:
    (card,) = memory_arithmetic(cards_gb=(80.0,), stages=(1, 2, 3, 7))["cards"]
    ranks = [(d["stacked_rank"], d["max_lora_rank"]) for d in card["lora_base"]]
    assert ranks == [(16, 16), (32, 32), (48, 64), (112, 128)]
    assert all(r in VLLM_RANKS for _, r in ranks)
    slots = [d["lora_slots_gb"] for d in card["lora_base"]]
    assert slots == sorted(slots) and slots[-1] == pytest.approx(8 * slots[0])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--turns", "0"], "--turns must be >= 1"),
        (["--conversations", "-1"], "--conversations must be >= 1"),
        (["--tolerance", "0"], "--tolerance must be a positive number"),
        (["--turns", "12", "--tokens", "64"], "does not fit the engine's max_model_len"),
    ],
)
def test_the_cli_refuses_a_workload_it_cannot_run_before_anything_starts(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_committed_table_is_the_committed_results_rendered() -> None:
    stored = json.loads((RESULTS / "results.json").read_text(encoding="utf-8"))
    assert (RESULTS / "results.md").read_text(encoding="utf-8") == report(stored)
    assert (RESULTS / "command.txt").read_text(encoding="utf-8").strip() == stored["command"]
    assert stored["command"].startswith("python -m benchmarks.throughput.lora_base")
