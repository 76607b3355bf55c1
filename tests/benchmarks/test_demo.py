"""The demo suite: the README block writer, the ratios, and one real end-to-end run on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.demo import (
    DEMO_TASKS,
    README_BEGIN,
    README_END,
    DemoTask,
    readme_block,
    run_demo,
    task_table,
    update_readme,
)
from optima_env.errors import DataError


def _demo(tasks: list[dict]) -> dict:
    return {
        "command": "python -m benchmarks.run --suite demo",
        "started": "2026-11-30 12:00 UTC",
        "wall_time_s": 600.0,
        "train_s": 1500.0,
        "eval_s": 900.0,
        "folder": "benchmarks/results/demo",
        "report": "benchmarks/results/demo/report.md",
        "tasks": tasks,
    }


SUMMARY = {
    "task": "ie/synth-v0",
    "name": "synth",
    "eval_split": "test",
    "status": "ok",
    "reason": "",
    "plot": "demo_synth.png",
    "rows": [
        {
            "method": "MAD",
            "score": 0.1,
            "tokens": 200.0,
            "instances": 40,
            "score_ratio": 1.0,
            "token_ratio": 1.0,
        },
        {
            "method": "iSFT iter 01",
            "score": 0.4,
            "tokens": 20.0,
            "instances": 40,
            "score_ratio": 4.0,
            "token_ratio": 0.1,
        },
    ],
}


def test_readme_block_replaces_only_what_lies_between_the_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{README_BEGIN}\nold table\n{README_END}\nafter\n", encoding="utf-8")
    block = readme_block(_demo([SUMMARY]))
    assert "| iSFT iter 01 | 0.400 | 20.0 | 4.00x | 0.10x |" in block
    assert "![synth](benchmarks/results/demo/demo_synth.png)" in block
    assert "(40 min of training and evaluation" in block
    update_readme(readme, block)
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# x\n\nbefore\n" + README_BEGIN + "\n") and text.endswith(
        README_END + "\nafter\n"
    )
    assert "old table" not in text and block in text
    update_readme(readme, block)  # idempotent
    assert readme.read_text(encoding="utf-8") == text


def test_missing_markers_are_a_clear_error(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"{README_END}\n{README_BEGIN}\n", encoding="utf-8")
    with pytest.raises(DataError, match="expected the markers"):
        update_readme(readme, "x\n")


def test_a_task_that_did_not_run_says_why() -> None:
    block = readme_block(_demo([{**SUMMARY, "status": "data missing", "reason": "no dev.jsonl", "rows": []}]))
    assert "not evaluated: data missing: no dev.jsonl" in block
    assert task_table(SUMMARY).count("\n") == 3  # header, rule, two rows


def test_demo_tasks_train_on_train_and_evaluate_on_held_out_rows() -> None:
    for spec in DEMO_TASKS:
        assert spec.eval_split != spec.train.get("split", "train")
        assert spec.train["iterations"] >= 1 and spec.why


@pytest.mark.slow
def test_demo_end_to_end_on_a_tiny_model_then_resumes(tmp_path: Path) -> None:
    """Real iSFT (TRL, LoRA) and real evaluation on a tiny random Llama; a rerun generates nothing."""
    pytest.importorskip("trl")
    from tests.optima_trainers.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    spec = DemoTask(
        name="synth",
        task="ie/synth-v0",
        task_kwargs={"num_distractors": 1, "style": "small"},
        model=str(model),
        train={
            "iterations": 2,
            "generation.instances": 2,
            "generation.num_samples": 2,
            "generation.max_turns": 2,
            "generation.max_new_tokens": 6,
            "selection.theta": -100.0,
            "sft.max_steps": 1,
            "generation.concurrency": 4,
            "reward_preset": "paper",
        },
        eval_instances=2,
        why="a smoke test",
    )
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{README_BEGIN}\n{README_END}\n", encoding="utf-8")
    out = tmp_path / "demo"
    demo = run_demo(out, tasks=[spec], update_readme_path=readme, progress=False)

    (summary,) = demo["tasks"]
    assert demo["train_s"] > 0 and demo["eval_s"] > 0
    assert [r["method"] for r in summary["rows"]] == ["MAD", "CoT", "iSFT iter 00", "iSFT iter 01"]
    assert all(r["instances"] == 2 and r["score"] is not None for r in summary["rows"])
    trained = summary["rows"][2:]
    assert all(r["train"]["select/selected"] > 0 and r["train"]["time/total_s"] > 0 for r in trained)
    assert (out / "report.md").read_text(encoding="utf-8").startswith("# Optima demo")
    assert (out / "demo_synth.png").stat().st_size > 1000
    assert json.loads((out / "demo.json").read_text(encoding="utf-8"))["tasks"][0]["rows"] == summary["rows"]
    assert "| iSFT iter 01 |" in readme.read_text(encoding="utf-8")
    episodes = out / "synth" / "eval" / "episodes.jsonl"
    assert len(episodes.read_text(encoding="utf-8").splitlines()) == 4 * 2  # 4 systems x 2 instances

    before = episodes.read_bytes()
    again = run_demo(out, tasks=[spec], progress=False)
    assert episodes.read_bytes() == before  # resumed: nothing regenerated
    assert again["tasks"][0]["rows"] == summary["rows"]
    assert (again["train_s"], again["eval_s"]) == (demo["train_s"], demo["eval_s"])  # the work's time, kept
