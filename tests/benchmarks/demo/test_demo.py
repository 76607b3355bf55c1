"""The demo suite: its recipe, its tables and targets, and one real end-to-end run on a tiny model."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.demo.report import readme_block, summarize, table1
from benchmarks.demo.suite import adapter_dir, run_demo
from benchmarks.demo.tasks import DEMO_TASKS, MAIN_TASK, TRAINERS, DemoTask
from benchmarks.demo.train import recorded_runs
from benchmarks.reports.readme import replace_block
from optima_env import make_task
from optima_env.errors import DataError, TaskContractError
from tests.helpers import REPO_ROOT


def test_the_main_task_needs_both_agents_on_every_held_out_instance() -> None:
    """The symbolic solver answers from all the facts, never from one agent's, and each agent holds
    at least two candidates for the last hop (a guess is not an answer)."""
    from optima_task_synth import Fact, solve

    task = make_task(MAIN_TASK.task, **dict(MAIN_TASK.task_kwargs))
    hops = MAIN_TASK.task_kwargs["hops"]
    assert hops >= 2
    for index in range(MAIN_TASK.eval_instances):
        sample = task.samples(MAIN_TASK.eval_split)[index]
        hands = [[Fact(*f) for f in hand] for hand in sample.metadata["hands"]]
        subject = sample.metadata["subject"]
        assert solve(subject, [f for hand in hands for f in hand], hops) == sample.answer
        for hand in hands:
            assert solve(subject, hand, hops) is None
        last = {f.obj for hand in hands for f in hand if f.relation == hops - 1}
        assert len(last) >= 2


def test_demo_tasks_train_on_train_rows_and_name_their_departures() -> None:
    for spec in DEMO_TASKS:
        assert spec.eval_split != "train" and spec.eval_instances >= 100
        assert spec.trainers in (TRAINERS, ()) and spec.max_turns == 10
        assert spec.trainers or spec.caption  # a task trained by none says why in its table
        assert {"cot", "sc", "mad", "autoform"} <= set(spec.baselines) and spec.sc_n == 8
        assert spec.controls == ("one-hand" in spec.baselines)  # a task with controls plays them all
        for trainer in spec.trainers:
            overrides = spec.config_overrides(trainer)
            assert overrides.get("split", "train") == "train" and overrides["iterations"] >= 2
        assert any("256" in d for d in spec.departures)  # the turn cap and why
        if spec.adapter_rank is not None:  # a truncated export says so, and why
            assert any(f"rank {spec.adapter_rank}" in d for d in spec.departures)


def _row(key: str, method: str, scores: list[float], tokens: list[float]) -> dict:
    return {
        "task": "ie/synth-v0",
        "method": method,
        "method_key": key,
        "score": sum(scores) / len(scores),
        "mean_tokens": sum(tokens) / len(tokens),
        "instances": len(scores),
        "instance_scores": scores,
        "instance_tokens": tokens,
    }


class _Run:
    """The fields of :class:`benchmarks.demo.train.TrainedRun` that the summary reads."""

    def __init__(self, trainer: str, stages: list[str]) -> None:
        self.trainer, self.shared = trainer, None
        self.stages = tuple((s, f"/runs/{trainer}/{s}") for s in stages)
        self.metrics = tuple({"stage": s, "select/selected": 4.0, "time/train_s": 10.0} for s in stages)

    def compute_s(self) -> float:
        return 10.0 * len(self.stages)


def test_summary_intervals_ratios_and_targets() -> None:
    n = 20
    mad = _row("mad", "MAD", [0.1 if i % 2 else 0.0 for i in range(n)], [200.0] * n)
    cot = _row("cot", "CoT", [0.2] * n, [30.0] * n)
    adapter = _row("ckpt:iSFT adapter", "iSFT adapter (r8, 0123abcd)", [0.5] * n, [15.0] * n)
    main = {"rows": [mad, cot, adapter], "tasks": [{"status": "ok", "reason": ""}], "eval_generate_s": 60.0}
    # the stages on the first m instances, beside MAD and CoT on the same ones
    m = 10
    stage_mad = _row("mad", "MAD", [0.1 if i % 2 else 0.0 for i in range(m)], [200.0] * m)
    isft = _row("ckpt:iSFT iter 01", "iSFT iter 01", [0.4] * m, [20.0] * m)
    stages = {"rows": [stage_mad, _row("cot", "CoT", [0.2] * m, [30.0] * m), isft], "eval_generate_s": 30.0}
    spec = DemoTask(name="synth", task="ie/synth-v0", trainers=("isft",), target_score_ratio=3.0,
                    target_token_ratio=0.1, target_above_cot=True)  # fmt: skip
    run = _Run("isft", ["iter_00", "iter_01"])
    finals = {"iSFT adapter (r8, 0123abcd)": "iSFT"}
    labels = {("isft", "iter_01"): "iSFT iter 01"}
    summary = summarize(spec, main, None, [run], {}, stages=stages, labels=labels, finals=finals)
    rows = {r["key"]: r for r in summary["rows"]}
    assert rows["ckpt:iSFT adapter"]["final_of"] == "iSFT" and "ckpt:iSFT iter 01" not in rows
    assert rows["ckpt:iSFT adapter"]["score_ratio"] == pytest.approx(10.0)
    assert rows["ckpt:iSFT adapter"]["token_ratio"] == pytest.approx(0.075)
    low, high = rows["mad"]["score_ci"]
    assert 0.0 < low < 0.05 < high < 0.1  # MAD scores 0.05 with spread; CoT's interval is a point
    assert rows["cot"]["score_ci"] == [0.2, 0.2]
    assert summary["targets"]["met"] and summary["targets"]["best"] == "iSFT"
    assert summary["train_s"] == 20.0 and summary["eval_s"] == 90.0  # the table's and the stages'
    assert [p["score"] for p in summary["curves"]["iSFT"]] == [None, pytest.approx(0.4)]  # iter 00 not played
    (stage_row,) = [r for r in summary["stage_rows"] if r["key"] == "ckpt:iSFT iter 01"]
    assert stage_row["instances"] == m and stage_row["score_ratio"] == pytest.approx(8.0)  # vs MAD's first m
    table = table1(summary)
    assert "| iSFT | 0.500 [0.500, 0.500] | 15.0 [15.0, 15.0] | 10.00x" in table
    assert "iter 01" not in table and "| iSFT iter 01 | 0.400" in table1(summary, stages=True)
    weak = _row("ckpt:iSFT adapter", "iSFT adapter (r8, 0123abcd)", [0.15] * n, [15.0] * n)
    worse = summarize(spec, {**main, "rows": [mad, cot, weak]}, None, [run], {}, labels={}, finals=finals)
    assert not worse["targets"]["met"]  # 3x MAD but below CoT
    assert "score 0.150 against CoT's 0.200 (not met)" in readme_block({"command": "c", "train_s": 1.0,
        "eval_s": 1.0, "report": "r.md", "folder": "f", "tasks": [worse]})  # fmt: skip
    # each part that misses says by how much
    long = _row("ckpt:iSFT adapter", "iSFT adapter (r8, 0123abcd)", [0.1] * n, [100.0] * n)
    missed = summarize(spec, {**main, "rows": [mad, cot, long]}, None, [run], {}, labels={}, finals=finals)
    line = readme_block({"command": "c", "train_s": 1.0, "eval_s": 1.0, "report": "r.md", "folder": "f",
                         "tasks": [missed]})  # fmt: skip
    assert "**not met**: score 2.00x MAD's (not met, 1.00x short of 3x)" in line
    assert "tokens 50.0% of MAD's (not met, 5.0 times the 10% allowed)" in line
    block = readme_block({"command": "c", "train_s": 60.0, "eval_s": 60.0, "report": "r.md", "folder": "f",
                          "tasks": [{**summary, "plots": ["demo_synth.png"]}]})  # fmt: skip
    assert "![demo_synth.png](f/demo_synth.png)" in block
    assert (
        "— met: score 10.00x MAD's (met); tokens 7.5% of MAD's (met); score 0.500 against CoT's 0.200 (met)."
        in block
    )
    assert "Still to run" not in block
    partial = readme_block({"command": "c", "train_s": 60.0, "eval_s": 60.0, "report": "r.md", "folder": "f",
                            "tasks": [summary], "pending": ["ie/hotpotqa-v0"]})  # fmt: skip
    assert "Still to run: ie/hotpotqa-v0 (the same command resumes" in partial


def test_a_demo_task_evaluates_its_stages_on_a_part_of_the_table_instances() -> None:
    with pytest.raises(TaskContractError, match=r"stage_instances must be in 1\.\.eval_instances"):
        DemoTask(name="synth", task="ie/synth-v0", eval_instances=20, stage_instances=30)
    for spec in DEMO_TASKS:
        assert spec.stage_instances <= spec.eval_instances


@pytest.mark.slow
def test_demo_end_to_end_on_a_tiny_model_then_a_rerun_regenerates_nothing(tmp_path: Path) -> None:
    """Real iSFT, iDPO and iSFT-DPO (TRL, LoRA) on a tiny random Llama, their adapters exported with
    a manifest, real evaluation of every baseline and stage, the README block; then a rerun."""
    pytest.importorskip("trl")
    from tests.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    spec = DemoTask(
        name="synth",
        task="ie/synth-v1",
        task_kwargs={"hops": 2, "style": "small"},
        baselines=("cot", "sc", "mad", "autoform", "one-hand"),
        controls=True,
        model=str(model),
        train={
            "generation.instances": 2,
            "generation.num_samples": 2,
            "generation.max_turns": 2,
            "generation.max_new_tokens": 6,
            "generation.concurrency": 4,
            "selection.theta": -100.0,
            "reward_preset": "paper",
            "sft.max_steps": 1,
            "dpo.max_steps": 1,
            "tree.instances": 2,
            "tree.selections": 2,
            "tree.rollouts": 2,
            "tree.normalizer_instances": 2,
            "tree.theta_filter": -100.0,
            "tree.theta_diff": 0.0,
        },
        train_by_trainer={
            "isft": {"iterations": 2},
            "idpo": {"iterations": 1},
            "isft-dpo": {"iterations": 1},
        },
        eval_instances=2,
        stage_instances=1,
        max_turns=2,
        max_new_tokens=6,
        sc_n=2,
        scaling_instances=2,
        scaling_k=2,
    )
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- begin demo -->\n<!-- end demo -->\n", encoding="utf-8")
    out = tmp_path / "demo"
    demo = run_demo(out, tasks=[spec], update_readme_path=readme, progress=False)

    (summary,) = demo["tasks"]
    assert demo["train_s"] > 0 and demo["eval_s"] > 0
    methods = [r["method"] for r in summary["rows"]]
    one_hand = "One hand (final-hop holder alone)"
    assert methods[:6] == ["CoT", "SC (n=2)", "MAD", "AutoForm", one_hand, "iSFT iter 00"]
    # the table: the baselines and the one-hand control, M_0 (the shared initialization), the three
    # exported adapters, then each adapter's counterfactual, on every held-out instance, each with
    # its paired difference to M_0, the counterfactuals also to their system; the computed ceiling
    assert [m.split(" (")[0] for m in methods[6:9]] == ["iSFT adapter", "iDPO adapter", "iSFT-DPO adapter"]
    assert methods[9:] == [f"{m} (counterfactual)" for m in methods[6:9]]
    assert all(r["score_vs_system_ci"] for r in summary["rows"][9:])
    assert summary["ceiling"] == 0.125 and "Check against the controls" in readme.read_text(encoding="utf-8")
    assert all(r["instances"] == 2 and r["score"] is not None and r["score_ci"] for r in summary["rows"])
    assert [r["control"] for r in summary["rows"]] == [False] * 5 + [True] + [False] * 6
    assert all(r["score_vs_m0_ci"] for r in summary["rows"] if not r["control"])
    assert summary["control"] == "iSFT iter 00" and summary["control_missing"] == {}
    # the curves: iSFT's two stages, then iDPO's and iSFT-DPO's own (their shared M_0 once), on the
    # first instance, beside MAD and CoT on it
    stage_rows = summary["stage_rows"]
    assert [r["method"] for r in stage_rows] == [
        "MAD", "CoT", "iSFT iter 00", "iSFT iter 01", "iDPO iter 01", "iSFT-DPO iter 00 dpo",
    ]  # fmt: skip
    assert all(r["instances"] == 1 and r["score"] is not None for r in stage_rows)
    results = json.loads((out / "synth" / "stages" / "results.json").read_text(encoding="utf-8"))
    assert results["files"]["episodes"] == os.path.join("..", "eval", "episodes.jsonl")
    assert not (out / "synth" / "stages" / "episodes.jsonl").exists()  # one store for both
    assert {r["final_of"] for r in summary["rows"] if r["final_of"]} == {"iSFT", "iDPO", "iSFT-DPO"}
    for trainer in TRAINERS:
        folder = adapter_dir(out, "synth", trainer)
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        assert manifest["provenance"]["trainer"] == trainer or manifest.get("trainer") == trainer
        assert (folder / "adapter_model.safetensors").is_file() and (folder / "adapter_config.json").is_file()
    assert summary["adapters"]["iSFT"]["folder"].endswith("adapters/synth/isft")
    # the adapter carries the final model exactly: the rank of its 2 r-16 stages, not a truncation
    assert spec.adapter_rank is None and summary["adapters"]["iSFT"]["rank"] == 32
    assert summary["adapters"]["iSFT"]["delta_relative_error"]["mean"] < 1e-2
    adopted_file = out / "synth" / "train" / "idpo" / "iter_00" / "adopted.json"
    adopted = json.loads(adopted_file.read_text(encoding="utf-8"))
    assert adopted["from"] == str(out / "synth" / "train" / "isft" / "iter_00")
    curves = summary["curves"]
    assert [p["shared"] for p in curves["iDPO"]] == [True, False]
    assert curves["iDPO"][0]["score"] == curves["iSFT"][0]["score"]  # M_0 is iSFT's iter 00 row
    # each stage's training data: selected conversations for SFT, preference pairs for DPO
    assert curves["iSFT"][1]["selected"] is not None and curves["iDPO"][1]["pairs"] is not None
    assert summary["scaling"] and all(len(c) == 2 for c in summary["scaling"].values())
    assert (out / "report.md").read_text(encoding="utf-8").startswith("# Optima demo")
    assert summary["plots"] == ["demo_synth.png", "demo_synth_scaling.png"]
    assert all((out / p).stat().st_size > 1000 for p in summary["plots"])
    assert "| iSFT-DPO |" in readme.read_text(encoding="utf-8")

    # the baselines were played before training, into the table's store, which the table resumed
    first = json.loads((out / "synth" / "baselines" / "results.json").read_text(encoding="utf-8"))
    assert [r["method"] for r in first["rows"]] == methods[:5]
    assert [r["score"] for r in first["rows"]] == [r["score"] for r in summary["rows"][:5]]
    assert first["units"]["resumed"] == 0 and not (out / "synth" / "baselines" / "episodes.jsonl").exists()
    table = json.loads((out / "synth" / "eval" / "results.json").read_text(encoding="utf-8"))
    # the stages were played before the table, into its store
    assert results["units"]["resumed"] == first["units"]["generated"] > 0
    assert table["units"]["resumed"] == first["units"]["generated"] + results["units"]["generated"]
    episodes = out / "synth" / "eval" / "episodes.jsonl"
    played = [*out.glob("synth/*/results.json"), *out.glob("synth/*/report.md")]  # + eval, stages, scaling
    assert len(played) == 8
    frozen = {p: p.read_bytes() for p in [episodes, *out.glob("adapters/synth/*/*"), *played]}
    mtimes = {p: p.stat().st_mtime_ns for p in frozen}
    again = run_demo(out, tasks=[spec], progress=False)
    assert {p: p.read_bytes() for p in frozen} == frozen  # resumed: nothing regenerated
    assert {p: p.stat().st_mtime_ns for p in frozen} == mtimes
    assert again["tasks"][0]["rows"] == summary["rows"]
    assert (again["train_s"], again["eval_s"]) == (demo["train_s"], demo["eval_s"])  # the work's time, kept
    replace_block(readme, "demo", readme_block(again))
    assert "| iSFT-DPO |" in readme.read_text(encoding="utf-8")

    # a fresh clone has the committed results and training folders without their merged weights
    # (.gitignore), and without the adapters of the stages left out of the commit: the training
    # record stands in for them (the stages' rows keep their keys), so nothing trains or plays again
    record = json.loads((out / "synth" / "training.json").read_text(encoding="utf-8"))
    assert [r["trainer"] for r in record["runs"]] == list(TRAINERS)
    assert set(record["runs"][1]["keys"]) == {"iter_01"}  # iDPO's M_0 is iSFT's row
    ignored = [*out.glob("synth/train/*/*/checkpoint/model*.safetensors"),
               *out.glob("synth/train/*/*/checkpoint/tokenizer.json")]  # fmt: skip
    assert len(ignored) >= 2 * len(TRAINERS)
    for path in ignored:
        path.unlink()
    shutil.rmtree(out / "synth" / "train" / "isft" / "iter_01" / "checkpoint" / "adapter")
    pages = sorted(out.glob("synth/*/viewer.html"))  # generated pages, not committed either
    assert len(pages) == len(played) // 2
    for page in pages:
        page.unlink()
    clone = run_demo(out, tasks=[spec], progress=False)
    assert sorted(out.glob("synth/*/viewer.html")) == pages  # written again from the episode stores
    assert not any(path.exists() for path in ignored)  # nothing trained, no weights rebuilt
    assert {p: p.read_bytes() for p in frozen} == frozen
    assert {p: p.stat().st_mtime_ns for p in frozen} == mtimes
    assert clone["tasks"][0]["rows"] == summary["rows"]
    assert clone["tasks"][0]["curves"] == summary["curves"]
    assert clone["train_s"] == demo["train_s"]  # the training's compute, from the record
    # runs trained before their folders were committed: the record alone
    shutil.rmtree(out / "synth" / "train")
    alone = run_demo(out, tasks=[spec], progress=False)
    assert not (out / "synth" / "train").exists()  # nothing trained
    assert {p: p.read_bytes() for p in frozen} == frozen
    assert alone["tasks"][0]["rows"] == summary["rows"]
    # a record that no longer agrees with the recipe or the adapters is not taken
    other = replace(spec, train={**spec.train, "sft.max_steps": 2})
    assert recorded_runs(other, out / "synth", out) is None
    assert recorded_runs(spec, out / "synth", out) is not None
    weights = adapter_dir(out, "synth", "idpo") / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + bytes(8))
    with pytest.raises(DataError, match="sha256"):
        recorded_runs(spec, out / "synth", out)


_COMMITTED = sorted(
    p.parent
    for p in REPO_ROOT.glob("benchmarks/results/demo/adapters/*/*/manifest.json")
)


@pytest.mark.skipif(not _COMMITTED, reason="no adapter committed yet (the demo suite writes them)")
@pytest.mark.parametrize("folder", _COMMITTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_adapters_verify_and_name_the_command_that_made_them(folder: Path) -> None:
    from optima_env.backends.peft_adapter import verify_manifest

    manifest = verify_manifest(folder)  # every file's sha256
    assert manifest is not None and isinstance(manifest["rank"], int) and manifest["rank"] >= 1
    assert "mean" in manifest["delta_relative_error"]  # the report prints how exact it is
    provenance = manifest["provenance"]
    assert provenance["command"].startswith("python -m benchmarks.run --suite demo")
    assert provenance["trainer"] == folder.name and provenance["git_commit"]
    # an exact adapter is about 9.8 MB a r-16 stage in fp16: under 100 MB, one file's limit on GitHub
    assert manifest["bytes"] < 100_000_000


def test_a_task_without_its_data_is_reported_and_the_readme_names_what_is_left(tmp_path, monkeypatch) -> None:
    """The demo goes on past a task whose data is missing: the report, demo.json and the README
    block say so after each task, and name the tasks still to run."""
    monkeypatch.setenv("OPTIMA_DATA_DIR", str(tmp_path / "no-data"))
    hotpot = next(s for s in DEMO_TASKS if s.name == "hotpotqa")
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- begin demo -->\n<!-- end demo -->\n", encoding="utf-8")
    out = tmp_path / "demo"
    blocks = []
    real = replace_block

    def spy(path, name, text):  # the block as each task ends
        blocks.append(text)
        real(path, name, text)

    monkeypatch.setattr("benchmarks.reports.readme.replace_block", spy)
    demo = run_demo(out, tasks=[hotpot, hotpot], update_readme_path=readme, progress=False)
    assert [s["status"] for s in demo["tasks"]] == ["data missing", "data missing"]
    assert len(blocks) == 2 and "Still to run: ie/hotpotqa-v0" in blocks[0]
    assert "Still to run" not in blocks[1] and demo["pending"] == []
    text = readme.read_text(encoding="utf-8")
    assert (
        "not evaluated: data missing" in text
        and text == f"intro\n<!-- begin demo -->\n{blocks[1]}<!-- end demo -->\n"
    )
    assert json.loads((out / "demo.json").read_text(encoding="utf-8"))["tasks"][0]["status"] == "data missing"


def test_a_run_of_one_task_keeps_the_other_tasks_published_tables(tmp_path, monkeypatch) -> None:
    """``--task hotpotqa`` rewrites HotpotQA's entry of demo.json, report.md and the README block
    and keeps the other task's as it was published (in the demo's order), not drop it."""
    monkeypatch.setenv("OPTIMA_DATA_DIR", str(tmp_path / "no-data"))
    hotpot = next(s for s in DEMO_TASKS if s.name == "hotpotqa")
    wiki = replace(hotpot, name="wiki", task="ie/2wikimultihopqa-v0")
    out = tmp_path / "demo"
    run_demo(out, tasks=[wiki, hotpot], progress=False)
    published = json.loads((out / "demo.json").read_text(encoding="utf-8"))
    published["tasks"][0]["reason"] = "as published before"  # what the next run must keep
    (out / "demo.json").write_text(json.dumps(published), encoding="utf-8")

    demo = run_demo(out, names=["hotpotqa"], tasks=[wiki, hotpot], progress=False)
    assert [t["task"] for t in demo["tasks"]] == ["ie/2wikimultihopqa-v0", "ie/hotpotqa-v0"]
    assert demo["tasks"][0] == published["tasks"][0]
    assert demo["tasks"][1]["reason"] != "as published before"
    assert "as published before" in (out / "report.md").read_text(encoding="utf-8")
    alone = run_demo(tmp_path / "fresh", names=["hotpotqa"], tasks=[wiki, hotpot], progress=False)
    assert [t["task"] for t in alone["tasks"]] == ["ie/hotpotqa-v0"]  # nothing published to keep


def test_a_one_task_run_reports_the_command_that_reproduces_the_whole_demo(tmp_path, monkeypatch) -> None:
    """``--task hotpotqa`` rewrites a report that shows every task, so the report and the README
    name the command without ``--task`` (which reruns every task), and this invocation's beside it."""
    from benchmarks.run import main

    monkeypatch.setenv("OPTIMA_DATA_DIR", str(tmp_path / "no-data"))  # HotpotQA: data missing, fast
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # main() sets it by default; restored after the test
    out = tmp_path / "demo"
    assert main(["--suite", "demo", "--task", "hotpotqa", "--out", str(out)]) == 0
    demo = json.loads((out / "demo.json").read_text(encoding="utf-8"))
    assert demo["command"] == f"python -m benchmarks.run --suite demo --out {out}"
    assert demo["invocation_command"] == f"python -m benchmarks.run --suite demo --task hotpotqa --out {out}"
    report = (out / "report.md").read_text(encoding="utf-8")
    assert f"Command: `{demo['command']}` (this invocation: `{demo['invocation_command']}`)" in report
    assert readme_block(demo).startswith(f"Generated by `{demo['command']}` (")


@pytest.mark.slow
def test_a_demo_task_without_trainers_plays_its_baselines_and_controls_and_says_why(tmp_path: Path) -> None:
    """A task whose probe found nothing to train (synth-v1 at 135M) keeps its table: the untrained
    baselines, the one-hand control and the computed ceiling, with its caption, and trains nothing."""
    from tests.tiny_model import make_tiny_model

    spec = DemoTask(
        name="synth", task="ie/synth-v1", task_kwargs={"hops": 2, "style": "small"}, trainers=(),
        baselines=("cot", "mad", "one-hand"), controls=True, model=str(make_tiny_model(tmp_path / "tiny")),
        eval_instances=2, stage_instances=1, max_turns=2, max_new_tokens=6, scaling_instances=0,
        target_score_ratio=3.0, target_token_ratio=0.1, target_above_cot=True,
        caption="Not trained: the probe found only guesses to select.",
    )  # fmt: skip
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- begin demo -->\n<!-- end demo -->\n", encoding="utf-8")
    out = tmp_path / "demo"
    (summary,) = run_demo(out, tasks=[spec], update_readme_path=readme, progress=False)["tasks"]
    assert [r["method"] for r in summary["rows"]] == ["CoT", "MAD", "One hand (final-hop holder alone)"]
    assert summary["ceiling"] == 0.125 and not summary["adapters"]
    assert not (out / "synth" / "train").exists() and not (out / "adapters").exists()
    text = readme.read_text(encoding="utf-8")
    assert "| One hand (final-hop holder alone) |" in text and "Not trained: the probe" in text
    assert "Target" not in text  # no trained system: nothing is claimed met or missed
