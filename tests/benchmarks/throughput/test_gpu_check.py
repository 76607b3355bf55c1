"""The prepared device check (``benchmarks.throughput.gpu_check``): its dry run on the CPU, with the tiny
shape, through the real trainer code (TRL's SFT and DPO trainers, the readability scorer)."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("trl")

from benchmarks.throughput.gpu_check import main
from benchmarks.throughput.gpu_check_phases import PHASES, PLANS, SHAPES, Recorder, engine_check

pytestmark = pytest.mark.slow  # runs a real model: the full suite only


def llama_parameters(shape: dict[str, int], vocab: int) -> int:
    """Parameters of a Llama model with untied embeddings, counted from its shape."""
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h
    return shape["num_hidden_layers"] * layer + 2 * vocab * h + h


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, one_torch_thread):
    out = tmp_path_factory.mktemp("gpu_check")
    assert main(["--dry-run", "--out", str(out / "out"), "--work-dir", str(out / "work")]) == 0
    return out, json.loads((out / "out" / "gpu_check.json").read_text())


def test_dry_run_records_every_phase_with_its_numbers(dry_run) -> None:
    _, doc = dry_run
    phases = doc["phases"]
    assert list(phases) == list(PHASES)
    for name, record in phases.items():
        assert record["status"] == "ok", (name, record.get("error"))
        assert record["seconds"] > 0 and record["after"]["rss_bytes"] > 0
        assert record["peak_allocated_bytes"] is None and record["after"]["free_bytes"] is None  # CPU
    assert phases["environment"]["dtype"] == "float32" and phases["environment"]["versions"]["trl"]
    assert phases["environment"]["work_disk_free_bytes"] > 0
    assert phases["environment"]["sft"]["lora"] and phases["environment"]["dpo"]["lora"]
    build = phases["build_model"]
    assert build["parameters"] == llama_parameters(SHAPES["tiny"], build["vocab_size"])
    assert build["weights_bytes"] >= 4 * build["parameters"]  # fp32 safetensors
    for stage in ("sft_stage_1", "sft_stage_2"):
        assert phases[stage]["steps"] == PLANS["tiny"].sft_steps
        assert math.isfinite(phases[stage]["train_loss"])
        assert phases[stage]["examples"] == PLANS["tiny"].sft_steps * PLANS["tiny"].sft_batch
    dpo = phases["dpo_step"]
    assert dpo["steps"] == 1 and math.isfinite(dpo["train_loss"])
    assert dpo["tokens"] == {"chosen": PLANS["tiny"].dpo_tokens, "rejected": PLANS["tiny"].dpo_tokens}
    readability = phases["readability"]
    assert readability["turns"] == 64 and readability["mean_loss"] > 0
    assert phases["fork"]["fork"] == phases["fork"]["spawn"] == "no CUDA"  # both children ran, on a CPU
    tree = phases["tree"]
    assert tree["default_utilization"] == 0.9 and 0 < tree["planned_utilization"] < 1
    assert tree["default"] == {"utilization": 0.9, "fits": None, "reason": "no CUDA device"}
    for name in ("build_model", "sft_stage_1", "sft_stage_2", "dpo_step", "readability"):
        engine = phases[name]["engine"]
        assert engine["utilization"] == phases["environment"]["utilization"] and engine["would_start"] is None
    assert doc["meta"]["shape"] == "tiny" and doc["meta"]["seconds"] > 0


def test_the_8b_plan_has_llama_3s_vocabulary_and_the_specs_longest_dpo_pairs() -> None:
    plan = PLANS["llama3-8b"]
    assert plan.vocab == 128256 and plan.dpo_tokens == 4096 and plan.sft_tokens == 2048
    assert llama_parameters(SHAPES["llama3-8b"], plan.vocab) == 8_030_261_248  # README "The device check"


def test_dry_run_keeps_at_most_the_last_checkpoint(dry_run) -> None:
    out, _ = dry_run
    models = sorted(p.name for p in (out / "work").iterdir() if (p / "config.json").is_file())
    assert models == ["sft_2"]  # base, sft_1 and dpo were deleted once the next phase had loaded them


def test_a_failing_phase_is_recorded_and_the_next_one_runs(tmp_path) -> None:
    import torch

    rec = Recorder(tmp_path, torch, budget_s=60)

    def fails(record):
        record["partial"] = 1
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    rec.run("first", fails)
    rec.run("second", lambda record: record.update(value=2))
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    first, second = doc["phases"]["first"], doc["phases"]["second"]
    assert first["status"] == "error" and first["oom"] and "out of memory" in first["error"]
    assert first["partial"] == 1 and first["seconds"] >= 0
    assert second == {**second, "status": "ok", "value": 2}
    skipping = Recorder(tmp_path, torch, budget_s=60, skip=("third",))
    skipping.run("third", fails)
    assert skipping.doc["phases"]["third"] == {"status": "skipped", "reason": "--skip"}


def test_past_the_budget_every_phase_is_skipped(tmp_path) -> None:
    assert main(["--dry-run", "--out", str(tmp_path), "--budget-s", "0"]) == 0
    phases = json.loads((tmp_path / "gpu_check.json").read_text())["phases"]
    assert list(phases) == list(PHASES)
    assert {r["status"] for r in phases.values()} == {"skipped"}
    assert "--budget-s" in phases["environment"]["reason"]


def test_engine_check_without_cuda_says_so() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert engine_check(torch, 0.85) == {"utilization": 0.85, "would_start": None, "reason": "no CUDA device"}


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--shape", "llama3-8b", "--out", "x"], "needs a CUDA GPU"),
        (["--dry-run"], "--out FOLDER is required"),
        (["--dry-run", "--out", "x", "--tokenizer", "/nonexistent"], "no tokenizer in /nonexistent"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(argv, expected, capsys, tmp_path, monkeypatch) -> None:
    import torch

    if torch.cuda.is_available() and "llama3-8b" in argv:
        pytest.skip("this machine has a GPU")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and expected in err and err.count("\n") == 1 and "Traceback" not in err
