"""The demo's control: the M_0 row and every row's paired difference to it, on a hand-built store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.demo.control import control_label, diff_cell
from benchmarks.demo.report import readme_block, summarize, table1
from benchmarks.demo.tasks import DemoTask
from benchmarks.evaluation.methods import PlaySettings, build_methods
from benchmarks.evaluation.outputs import collect_results
from benchmarks.evaluation.store import EpisodeStore
from benchmarks.evaluation.units import TaskEntry
from optima_env import Episode, Turn
from tests.helpers import TinyTask

N = 12
TASK = "t/x-v0"


def _episode(method: str, instance: int, score: float, tokens: int) -> Episode:
    return Episode(
        task_id=TASK,
        sample_id=f"s{instance}",
        seed=0,
        agents=("Alice", "Bob"),
        turns=(Turn(index=0, agent="Alice", text="Alice: hi", num_tokens=tokens, answer=None),),
        final_answer=None,
        gold=("gold",),
        task_score=score,
        terminated=False,
        truncated=True,
        end_reason="max_turns",
        num_tokens=tokens,
        system_prompts={"Alice": "a", "Bob": "b"},
        base_system_prompts={"Alice": "a", "Bob": "b"},
        metadata={"method": method, "instance": instance, "sample": 0},
    )


class _Run:
    def __init__(self, trainer: str, stages: list[str]) -> None:
        self.trainer, self.shared = trainer, None
        self.stages = tuple((s, f"/gone/{trainer}/{s}") for s in stages)
        self.metrics = tuple({"stage": s} for s in stages)

    def compute_s(self) -> float:
        return 0.0


@pytest.fixture()
def columns() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    m0 = rng.uniform(0, 0.3, N).round(3)
    return {  # (scores, tokens) per row
        "mad": (rng.uniform(0, 0.1, N).round(3), rng.integers(150, 250, N).astype(float)),
        "iSFT iter 00": (m0, rng.integers(60, 90, N).astype(float)),
        "iDPO iter 01": (
            (m0 + rng.normal(0.05, 0.04, N)).clip(0, 1).round(3),
            rng.integers(40, 80, N).astype(float),
        ),
        "iDPO adapter (r8, 0123abcd)": (
            rng.uniform(0, 0.4, N).round(3),
            rng.integers(30, 60, N).astype(float),
        ),
    }


def _results(tmp_path: Path, columns, labels: list[str]) -> dict:
    """``collect_results`` over a store of hand-built episodes (one per instance and row)."""
    store = EpisodeStore(tmp_path / "episodes.jsonl")
    checkpoints = {label: f"/gone/{label}" for label in labels if label != "mad"}
    methods = build_methods(("mad",), checkpoints, PlaySettings(max_turns=2, max_new_tokens=8))
    for method in methods:
        scores, tokens = columns["mad" if method.key == "mad" else method.label]
        for i in range(N):
            if (method.key, TASK, i, 0) not in store:
                store.add(_episode(method.key, i, float(scores[i]), int(tokens[i])))
    entry = TaskEntry(task=TASK, family="information_exchange", obj=TinyTask(), instances=N)
    return {**collect_results([entry], methods, store), "eval_generate_s": 1.0}


def _paired(values: np.ndarray, base: np.ndarray) -> tuple[float, float, float]:
    """The difference of the means and its 95% percentile interval over 2000 shared resamples of the
    instances (numpy's generator, seed 0), computed here from the two columns."""
    index = np.random.default_rng(0).integers(0, N, size=(2000, N))
    resampled = values[index].mean(axis=1) - base[index].mean(axis=1)
    low, high = np.quantile(resampled, [0.025, 0.975])
    return float(values.mean() - base.mean()), float(low), float(high)


def test_every_row_gets_its_paired_difference_to_m0_and_a_table_without_m0_says_so(tmp_path, columns) -> None:
    spec = DemoTask(name="synth", task=TASK, trainers=("isft", "idpo"))
    runs = [_Run("isft", ["iter_00"]), _Run("idpo", ["iter_01"])]
    control = control_label(runs)
    assert control == "iSFT iter 00"
    stages = _results(tmp_path / "stages", columns, ["mad", "iSFT iter 00", "iDPO iter 01"])
    main = _results(tmp_path / "main", columns, ["mad", "iDPO adapter (r8, 0123abcd)"])  # no M_0 played
    labels = {("isft", "iter_00"): "iSFT iter 00", ("idpo", "iter_01"): "iDPO iter 01"}
    finals = {"iDPO adapter (r8, 0123abcd)": "iDPO"}
    summary = summarize(
        spec, main, None, runs, {}, stages=stages, labels=labels, finals=finals, control=control
    )

    rows = {r["method"]: r for r in summary["stage_rows"]}
    assert rows["iSFT iter 00"]["control"] and rows["iSFT iter 00"]["score_vs_m0"] is None
    m0_scores, m0_tokens = columns["iSFT iter 00"]
    for label in ("iDPO iter 01", "MAD"):
        scores, tokens = columns["mad" if label == "MAD" else label]
        row = rows[label]
        for value, base, name in ((scores, m0_scores, "score_vs_m0"), (tokens, m0_tokens, "tokens_vs_m0")):
            estimate, low, high = _paired(value, base)
            assert row[name] == pytest.approx(estimate, abs=1e-12)
            assert row[f"{name}_ci"] == pytest.approx([low, high], abs=1e-4)
            assert low <= estimate <= high
    stage_table = table1(summary, stages=True)
    assert "| M_0 (iSFT iter 00, shared initialization) |" in stage_table
    idpo = rows["iDPO iter 01"]
    assert diff_cell(idpo["score_vs_m0"], idpo["score_vs_m0_ci"], 3) in stage_table
    assert "M_0 missing" not in stage_table

    # the table of adapters has no M_0 episodes: no difference, and the report says why
    assert all(r.get("score_vs_m0") is None and not r["control"] for r in summary["rows"])
    assert set(summary["control_missing"]) == {"table"}
    assert "iSFT iter 00" in summary["control_missing"]["table"]
    block = readme_block({"command": "c", "train_s": 1.0, "eval_s": 1.0, "report": "r.md", "folder": "f",
                          "tasks": [summary]})  # fmt: skip
    assert (
        "**M_0 missing**: M_0 (iSFT iter 00, the shared initialization) is missing from this table" in block
    )

    # with M_0 played in the table too, the adapters are compared with it there
    main = _results(tmp_path / "both", columns, ["mad", "iSFT iter 00", "iDPO adapter (r8, 0123abcd)"])
    summary = summarize(
        spec, main, None, runs, {}, stages=stages, labels=labels, finals=finals, control=control
    )
    (adapter,) = [r for r in summary["rows"] if r["final_of"] == "iDPO"]
    estimate, low, high = _paired(columns["iDPO adapter (r8, 0123abcd)"][0], m0_scores)
    assert adapter["score_vs_m0"] == pytest.approx(estimate) and adapter["score_vs_m0_ci"] == pytest.approx(
        [low, high], abs=1e-4
    )
    assert summary["control_missing"] == {} and "M_0 missing" not in table1(summary)


def test_the_curves_show_each_dpo_stage_s_held_out_pairs(tmp_path, columns) -> None:
    from benchmarks.demo.report import render_report

    spec = DemoTask(name="synth", task=TASK, trainers=("isft", "idpo"))
    runs = [_Run("isft", ["iter_00"]), _Run("idpo", ["iter_01"])]
    held_out = {"train/eval_rewards/accuracies": 0.75, "train/eval_rewards/margins": 0.0123}
    runs[1].metrics = ({"stage": "iter_01", **held_out},)  # as the stage's metrics.jsonl record has them
    main = _results(tmp_path, columns, ["mad", "iSFT iter 00"])
    summary = summarize(spec, main, None, runs, {}, labels={}, finals={}, control=control_label(runs))
    demo = {"command": "c", "started": "s", "wall_time_s": 1.0, "train_s": 1.0, "eval_s": 1.0,
            "git_commit": "g", "threads": 1, "tasks": [summary]}  # fmt: skip
    lines = render_report(demo).splitlines()
    (isft,) = [line for line in lines if line.startswith("| iSFT | iter_00")]
    (idpo,) = [line for line in lines if line.startswith("| iDPO | iter_01")]
    assert "| 0.75 / 0.0123 |" in idpo and "| – |" in isft  # SFT stages have no pairs


def test_the_committed_tables_rerender_with_m0_and_no_model(tmp_path, columns, capsys, monkeypatch) -> None:
    import json

    from benchmarks.demo.rerender import main

    out = tmp_path / "demo"
    for folder, labels in (
        ("stages", ["mad", "iSFT iter 00", "iDPO iter 01"]),
        ("eval", ["mad", "iDPO adapter (r8, 0123abcd)"]),
    ):
        results = _results(tmp_path / folder, columns, labels)
        (out / "synth" / folder).mkdir(parents=True)
        (out / "synth" / folder / "results.json").write_text(json.dumps(results), encoding="utf-8")
    spec = DemoTask(name="synth", task=TASK, trainers=("isft", "idpo"))
    runs = [_Run("isft", ["iter_00"]), _Run("idpo", ["iter_01"])]
    finals = {"iDPO adapter (r8, 0123abcd)": "iDPO"}
    published = _results(tmp_path / "e", columns, ["mad", "iDPO adapter (r8, 0123abcd)"])
    old = summarize(spec, published, None, runs, {}, stages=None, labels={}, finals=finals)
    assert [p["stage"] for p in old["curves"]["iSFT"]] == ["iter_00"]  # what names M_0 on a re-render
    demo = {"command": "c", "started": "s", "wall_time_s": 1.0, "train_s": 1.0, "eval_s": 1.0,
            "git_commit": "g", "threads": 1, "folder": str(out), "report": "r.md",
            "tasks": [json.loads(json.dumps(old))]}  # fmt: skip
    (out / "demo.json").write_text(json.dumps(demo), encoding="utf-8")
    assert main([str(out)]) == 0
    new = json.loads((out / "demo.json").read_text(encoding="utf-8"))
    (task,) = new["tasks"]
    assert task["control"] == "iSFT iter 00" and set(task["control_missing"]) == {"table"}
    (idpo,) = [r for r in task["stage_rows"] if r["method"] == "iDPO iter 01"]
    estimate, low, high = _paired(columns["iDPO iter 01"][0], columns["iSFT iter 00"][0])
    assert idpo["score_vs_m0"] == pytest.approx(estimate) and idpo["score_vs_m0_ci"] == pytest.approx(
        [low, high], abs=1e-4
    )
    assert [r["final_of"] for r in task["rows"]] == [None, "iDPO"]  # kept from the published rows
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "| M_0 (iSFT iter 00, shared initialization) |" in report and "**M_0 missing**" in report
    assert "no model run" in report
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- begin demo -->\nSTALE BLOCK\n<!-- end demo -->\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main([str(out), "--update-readme"]) == 0
    block = readme.read_text(encoding="utf-8")
    assert "STALE BLOCK" not in block and "**M_0 missing**" in block and "--update-readme` at" in block
    assert main([str(tmp_path / "nothing")]) == 2 and "cannot re-render" in capsys.readouterr().err


def test_the_doctests_pass() -> None:
    import doctest

    from benchmarks.demo import control as demo_control

    result = doctest.testmod(demo_control)
    assert result.attempted and result.failed == 0


def test_the_learning_check_reports_each_dpo_run_against_m0_and_each_dpo_stage() -> None:
    from benchmarks.demo.control import learning_lines

    summary = {
        "rows": [
            {"method": "iSFT iter 00", "control": True},
            {"method": "iDPO adapter (r8, 01)", "final_of": "iDPO", "score_vs_m0": 0.04,
             "score_vs_m0_ci": [0.01, 0.07], "score": 0.12, "tokens": 52.5},
            {"method": "iSFT-DPO adapter (r8, 02)", "final_of": "iSFT-DPO", "score_vs_m0": 0.01,
             "score_vs_m0_ci": [-0.02, 0.04], "score": 0.09, "tokens": 30.0},
        ],
        "curves": {
            "iSFT": [{"stage": "iter_00", "pairs": None}],
            "iDPO": [{"stage": "iter_00", "pairs": None, "shared": True},
                     {"stage": "iter_01", "pairs": 104.0, "pair_accuracy": 0.7, "eval_pairs": 10.0,
                      "pair_gaps": {"task": 0.268, "token": 0.213, "readability": -0.02}},
                     {"stage": "iter_02", "pairs": 96.0, "pair_accuracy": 0.8}],
            "iSFT-DPO": [{"stage": "iter_00_dpo", "pairs": 120.0, "pair_accuracy": None}],
        },
    }  # fmt: skip
    text = "\n".join(learning_lines(summary))
    assert "iSFT:" not in text  # no DPO stage, no check
    assert "- iDPO: adapter vs M_0 +0.040 [+0.010, +0.070] (met" in text
    assert "- iSFT-DPO: adapter vs M_0 +0.010 [-0.020, +0.040] (not met" in text
    # the held-out count and the accuracy's Wilson interval (7 of 10: 0.3968-0.8922)
    assert (
        "iter_01: 104 pairs, held-out pair accuracy 0.70 (7 of 10, 95% interval 0.40-0.89) (met); "
        "mean gap chosen - rejected: task +0.268, token +0.213, readability -0.020"
    ) in text
    assert "iter_02: 96 pairs, held-out pair accuracy 0.80 (not met)" in text  # too few pairs
    assert "iter_00_dpo: 120 pairs, held-out pair accuracy not evaluated (not met)" in text
    assert "the best trained system (iDPO): 52.5 tokens per episode (not met, at most 40 wanted)" in text
    assert learning_lines({"rows": [], "curves": {"iSFT": [{"stage": "iter_00", "pairs": None}]}}) == []
