"""The rollout throughput suite: its command line, its resume, and a tiny real run (slow)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from benchmarks.rollout_bench import SuiteConfig, run_rollout_suite
from optima_env.io import write_json_atomic
from tests.benchmarks.bench_helpers import assert_png
from tests.helpers import REPO_ROOT

TINY = dict(
    episodes=2,
    samples=2,
    naive_episodes=1,
    concurrency=2,
    max_turns=2,
    max_new_tokens=4,
    roofline_context=16,
)


def test_help_runs_on_its_own() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.rollout_bench", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr
    assert "--concurrency" in proc.stdout and "naive" in proc.stdout and "roofline" in proc.stdout


def saved_phase(name: str, cfg: SuiteConfig, **result) -> dict:
    return {"phase": name, "config": dataclasses.asdict(cfg), "result": result}


def test_saved_phases_are_reused_and_ratios_come_from_them(tmp_path) -> None:
    cfg = SuiteConfig(**TINY)
    common = dict(episodes=2, turns=4, generated_tokens=16, seconds=2.0, peak_rss_gb=1.0, startup_s=1.0)
    phases = {
        "naive": dict(common, tokens_per_s=2.0, tokens_per_cpu_s=1.0, episodes_per_s=0.25, backend="naive"),
        "engine": dict(
            common, tokens_per_s=30.0, tokens_per_cpu_s=12.0, episodes_per_s=2.5, backend="engine"
        ),
        "vllm": dict(common, tokens_per_s=20.0, tokens_per_cpu_s=16.0, episodes_per_s=2.0, backend="vllm"),
    }
    for name, result in phases.items():
        write_json_atomic(tmp_path / f"phase_{name}.json", saved_phase(name, cfg, **result))
    # nothing runs: every phase is on disk with the same settings
    summary = run_rollout_suite(out_dir=tmp_path, phases=("naive", "engine", "vllm"), **TINY)
    assert summary["targets"]["engine_vs_naive"] == pytest.approx(15.0)
    assert summary["targets"]["engine_vs_naive_cpu"] == pytest.approx(12.0)
    assert summary["targets"]["engine_vs_vllm"] == pytest.approx(1.5)
    assert summary["targets"]["engine_vs_vllm_cpu"] == pytest.approx(0.75)
    engine = next(r for r in summary["phases"] if r["phase"] == "engine")
    assert engine["x_naive_episodes"] == pytest.approx(10.0)
    table = (tmp_path / "results.md").read_text()
    assert "| engine | engine | 2 | 4 | 30.0 | 12.0 | 2.500 | 15.0 | 12.0 | 10.0 | 1.0 | 1.00 |" in table
    assert json.loads((tmp_path / "results.json").read_text())["config"] == dataclasses.asdict(cfg)
    assert_png(tmp_path / "throughput.png")


def test_a_phase_saved_with_other_settings_is_not_reused(tmp_path, monkeypatch) -> None:
    old = SuiteConfig(**{**TINY, "max_new_tokens": 99})
    write_json_atomic(tmp_path / "phase_naive.json", saved_phase("naive", old, tokens_per_s=1.0))
    ran = []

    class WouldRun(Exception):
        pass

    def fake_run(cmd, **kwargs):
        ran.append(cmd)
        raise WouldRun

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(WouldRun):
        run_rollout_suite(out_dir=tmp_path, phases=("naive",), **TINY)
    assert ran[0][1:6] == ["-m", "benchmarks.rollout_bench", "--phase", "naive", "--out"]
    assert ran[0][ran[0].index("--max-new-tokens") + 1] == "4"


def test_unknown_phases_are_rejected(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown phases"):
        run_rollout_suite(out_dir=tmp_path, phases=("fast",))


@pytest.mark.slow
def test_a_tiny_suite_runs_every_phase_for_real(tmp_path) -> None:
    pytest.importorskip("torch")
    summary = run_rollout_suite(out_dir=tmp_path, phases=("roofline", "naive", "engine"), **TINY)
    by_phase = {r["phase"]: r for r in summary["phases"]}
    assert by_phase["naive"]["episodes"] == 1 and by_phase["engine"]["episodes"] == 2
    for name in ("naive", "engine"):
        row = by_phase[name]
        assert row["generated_tokens"] == row["turns"] * 4 and row["tokens_per_s"] > 0
        assert row["peak_rss_gb"] > 0.3
    assert by_phase["roofline"]["tokens_per_s"] > 0
    assert summary["targets"]["engine_vs_naive"] > 0
