"""Each suite's shape with the scripted policy: rows, files and schemas."""

from __future__ import annotations

import json

import pytest

from benchmarks.run import parse_args, run
from benchmarks.suites import PAPER_TASKS, SUITES, get_suite
from optima_env import resolve_task_id
from optima_env.io import read_episodes
from tests.benchmarks.bench_helpers import MISSING_REASON, assert_png


def test_main_is_the_default_suite_and_plays_the_demo_setting_and_adapters() -> None:
    from benchmarks.demo.tasks import MAIN_TASK, trainer_label

    args = parse_args([])
    assert args.suite == "main" and args.model == "embedded"
    main = get_suite("main")
    assert main.tasks == ((MAIN_TASK.task,),) and main.methods == ("cot", "mad") and main.controls
    assert main.task_kwargs == {MAIN_TASK.task: dict(MAIN_TASK.task_kwargs)}
    assert (main.max_turns, main.max_new_tokens) == (MAIN_TASK.max_turns, MAIN_TASK.max_new_tokens)
    assert [label for label, _ in main.adapters] == [trainer_label(t) for t in MAIN_TASK.trainers]
    assert all(folder.endswith(f"adapters/{MAIN_TASK.name}/{t}") for (_, folder), t in
               zip(main.adapters, MAIN_TASK.trainers, strict=True))  # fmt: skip
    smoke = get_suite("smoke")
    assert smoke.tasks == (("ie/synth-v1",),) and smoke.methods == ("cot", "mad") and smoke.instances


def test_concurrency_is_the_suites_unless_the_flag_says_otherwise() -> None:
    from benchmarks.evaluate import suite_concurrency

    main = get_suite("main")
    assert main.instances is not None and main.concurrency >= main.instances  # one batch
    assert suite_concurrency(parse_args([]), main) == main.concurrency
    assert suite_concurrency(parse_args(["--concurrency", "4"]), main) == 4
    assert suite_concurrency(parse_args(["--suite", "smoke"]), get_suite("smoke")) == 16


def test_paper_suite_uses_the_spec_evaluation_sets() -> None:
    paper = SUITES["paper"]
    assert len(paper.tasks) == 8 and set(paper.methods) == {"cot", "sc", "mad", "autoform"}
    assert paper.sc_n == 8 and paper.max_turns == 10 and paper.backend == "vllm"
    # spec §8.1: the first 1000 items of the IE sets, the full debate test sets
    assert paper.num_instances(family="information_exchange", available=7405) == 1000
    assert paper.num_instances(family="debate", available=1319) == 1319
    assert paper.num_instances(family="debate", available=1319, override=5) == 5


def test_paper_tasks_resolve_to_the_registered_paper_plugins() -> None:
    resolved = []
    for names in PAPER_TASKS:
        for name in names:
            try:
                resolved.append(resolve_task_id(name))
                break
            except LookupError:
                continue
    if len(resolved) < len(PAPER_TASKS):
        pytest.skip(f"only {resolved} of the paper tasks are installed")
    assert len(set(resolved)) == 8


def test_paper_suite_shape(bench) -> None:
    results, out = bench(
        "--suite", "paper", "--model", "scripted", "--task", "ie/synth-v0", "--episodes", "2",
        "--checkpoint", "Optima-iSFT=scripted",
    )  # fmt: skip
    labels = [r["method"] for r in results["rows"]]
    assert labels == ["CoT", "SC (n=8)", "MAD", "AutoForm", "Optima-iSFT"]
    by_label = {r["method"]: r for r in results["rows"]}
    assert by_label["SC (n=8)"]["episodes"] == 16 and by_label["SC (n=8)"]["instances"] == 2
    assert by_label["MAD"]["episodes"] == 2
    episodes = read_episodes(out / "episodes.jsonl")
    sc = [e for e in episodes if e.metadata["method"] == "sc"]
    assert len(sc) == 16 and len({e.seed for e in sc}) == 16  # 8 distinct samples per instance
    # SC tokens are the sum over the samples of an instance
    per_instance = [sum(e.num_tokens for e in sc if e.metadata["instance"] == i) for i in range(2)]
    assert by_label["SC (n=8)"]["mean_tokens"] == sum(per_instance) / 2
    ckpt = [e for e in episodes if e.metadata["method"] == "ckpt:Optima-iSFT"]
    assert ckpt and all(e.system_prompts == e.base_system_prompts for e in ckpt)
    report = (out / "report.md").read_text()
    assert "| Optima-iSFT |" in report and "| SC (n=8) |" in report
    assert results["methods"][-1]["model"] == "scripted"


def test_scaling_suite_shape(bench) -> None:
    results, out = bench("--suite", "scaling", "--model", "scripted", "--episodes", "3", "--scaling-k", "4")
    curves = results["curves"]["ie/synth-v1"]
    assert set(curves) == {r["method"] for r in results["rows"]} and len(curves) == 2
    for curve in curves.values():
        assert [p["k"] for p in curve] == [1, 2, 3, 4]
        assert set(curve[0]) == {"k", "score", "coverage", "tokens"}
        tokens = [p["tokens"] for p in curve]
        coverage = [p["coverage"] for p in curve]
        assert tokens == sorted(tokens) and tokens[0] > 0
        assert coverage == sorted(coverage)  # best of k never falls
        assert all(p["coverage"] >= p["score"] for p in curve)
    for row in results["rows"]:
        assert row["episodes"] == 12 and row["coverage"] == curves[row["method"]][-1]["coverage"]
    episodes = read_episodes(out / "episodes.jsonl")
    assert {e.metadata["method"] for e in episodes} == {"scaling:mad", "scaling:cot"}
    assert_png(out / "scaling.png")
    assert_png(out / "score_vs_tokens.png")
    report = (out / "report.md").read_text()
    assert "Inference scaling" in report and "| majority vote | coverage |" in report
    assert json.loads((out / "results.json").read_text())["files"]["plots"] == [
        "score_vs_tokens.png",
        "scaling.png",
    ]


def test_scaling_suite_rejects_sc() -> None:
    with pytest.raises(Exception, match="drop 'sc'"):
        run(parse_args(["--suite", "scaling", "--model", "scripted", "--methods", "sc"]))


def test_missing_data_is_reported_per_task(bench, test_pm) -> None:
    results, out = bench(
        "--model", "scripted", "--task", "test/nodata-v0,ie/synth-v0", "--episodes", "2", pm=test_pm
    )
    rows = {(r["task"], r["method"]): r for r in results["rows"]}
    missing = rows[("test/nodata-v0", "CoT")]
    assert missing["status"] == "data missing" and missing["reason"] == MISSING_REASON
    assert missing["score"] is None and missing["episodes"] == 0
    assert rows[("ie/synth-v0", "MAD")]["status"] == "ok" and rows[("ie/synth-v0", "MAD")]["episodes"] == 2
    report = (out / "report.md").read_text()
    assert f"test/nodata-v0: data missing: {MISSING_REASON}" in report
    assert f"| test/nodata-v0 | CoT | data missing: {MISSING_REASON} |" in report


def test_rollout_suite_calls_the_rollout_benchmark(tmp_path, monkeypatch) -> None:
    from benchmarks.throughput import rollout_bench

    calls = []

    def run_rollout_suite(*, out_dir, model="embedded", seed=0, precision="auto"):
        calls.append((out_dir, model, seed, precision))
        return {"speedup": 1.0}

    monkeypatch.setattr(rollout_bench, "run_rollout_suite", run_rollout_suite)
    argv = ["--suite", "rollout", "--model", "scripted", "--out", str(tmp_path), "--seed", "3"]
    result = run(parse_args([*argv, "--precision", "float32"]))
    assert result == {"speedup": 1.0} and calls == [(tmp_path, "scripted", 3, "float32")]
