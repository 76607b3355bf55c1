"""The rollout throughput suite: its command line, its resume, and a tiny real run (slow)."""

from __future__ import annotations

import dataclasses
import doctest
import json
import os
import subprocess
import sys

import pytest

from benchmarks.throughput import rollout_phases
from benchmarks.throughput.rollout_bench import SuiteConfig, run_rollout_suite
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
        [sys.executable, "-m", "benchmarks.throughput.rollout_bench", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr
    assert "--concurrency" in proc.stdout and "naive" in proc.stdout and "roofline" in proc.stdout
    assert "ct2_int8_b64" in proc.stdout and "gemm" in proc.stdout


def saved_phase(name: str, cfg: SuiteConfig, **result) -> dict:
    return {"phase": name, "config": dataclasses.asdict(cfg), "result": result}


def test_saved_phases_are_reused_and_ratios_come_from_them(tmp_path) -> None:
    cfg = SuiteConfig(**TINY)
    common = dict(episodes=2, turns=4, generated_tokens=16, seconds=2.0, peak_rss_gb=1.0, startup_s=1.0)

    def rates(batch: int, tok_s: float) -> dict:
        return dict(common, batch=batch, tokens_per_s=tok_s, tokens_per_cpu_s=tok_s / 2, episodes_per_s=1.0)

    phases = {
        "gemm": dict(
            limits={"32": dict(tokens_per_s=100.0, gflops=27.0), "64": dict(tokens_per_s=200.0, gflops=54.0)},
            params_per_token=135_000_000,
            backend="gemm",
        ),
        "naive": dict(
            common, batch=1, tokens_per_s=2.0, tokens_per_cpu_s=1.0, episodes_per_s=0.25, backend="naive"
        ),
        "engine": dict(
            common, batch=2, tokens_per_s=30.0, tokens_per_cpu_s=12.0, episodes_per_s=2.5, backend="engine"
        ),
        "engine_b64": rates(64, 40.0),
        "vllm": dict(common, tokens_per_s=20.0, tokens_per_cpu_s=16.0, episodes_per_s=2.0, backend="vllm"),
        "ct2_int8_b32": rates(32, 90.0),
        "ct2_int8_b64": rates(64, 160.0),
        "ct2_float32_b32": rates(32, 60.0),
        "ct2_float32_b64": rates(64, 80.0),
    }
    for name, result in phases.items():
        write_json_atomic(tmp_path / f"phase_{name}.json", saved_phase(name, cfg, **result))
    # nothing runs: every phase is on disk with the same settings
    summary = run_rollout_suite(out_dir=tmp_path, phases=tuple(phases), **TINY)
    targets = summary["targets"]
    assert targets["engine_vs_naive"] == pytest.approx(15.0)
    assert targets["engine_vs_naive_cpu"] == pytest.approx(12.0)
    assert targets["engine_vs_vllm"] == pytest.approx(1.5)
    assert targets["engine_vs_vllm_cpu"] == pytest.approx(0.75)
    assert targets["ct2_int8_vs_naive"] == pytest.approx(80.0)  # the best int8 batch: 64
    assert targets["ct2_int8_vs_engine"] == pytest.approx(4.0)  # against the best engine batch: 64
    assert targets["ct2_float32_of_gemm_limit"] == pytest.approx(0.6)  # 60 / 100 at batch 32
    by_phase = {r["phase"]: r for r in summary["phases"]}
    assert by_phase["engine"]["x_naive_episodes"] == pytest.approx(10.0)
    assert by_phase["engine"]["of_gemm_limit"] == pytest.approx(0.3)  # batch 2: the nearest limit, 32
    assert by_phase["ct2_int8_b64"]["of_gemm_limit"] == pytest.approx(0.8)
    assert "of_gemm_limit" not in by_phase["vllm"]  # no batch recorded
    table = (tmp_path / "results.md").read_text()
    assert (
        "| engine | engine | 2 | 2 | 4 | 30.0 | 12.0 | 2.500 | 15.0 | 12.0 | 10.0 | 30% | 1.0 | 1.00 |"
        in table
    )
    assert "batch 64: 200.0 tok/s (54.0 GFLOP/s)" in table and "135.0M parameters per token" in table
    assert "60% of the GEMM limit" in table
    assert json.loads((tmp_path / "results.json").read_text())["config"] == dataclasses.asdict(cfg)
    assert_png(tmp_path / "throughput.png")


def test_phase_names_and_the_model_shapes() -> None:
    assert doctest.testmod(rollout_phases).failed == 0
    assert rollout_phases.phase_batch("ct2_float32_b32", SuiteConfig()) == ("ct2_float32", 32)
    assert rollout_phases.phase_batch("vllm", SuiteConfig(concurrency=8)) == ("vllm", 8)


@pytest.mark.slow
def test_the_gemm_limit_counts_every_parameter_of_the_embedded_model() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from optima_env.models import ensure_embedded_model

    config = transformers.AutoConfig.from_pretrained(ensure_embedded_model())
    params = sum(k * n * c for k, n, c in rollout_phases.linear_shapes(config))
    model = transformers.AutoModelForCausalLM.from_config(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert params == linear  # the LM head (tied to the embeddings) included


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
    assert ran[0][1:6] == ["-m", "benchmarks.throughput.rollout_bench", "--phase", "naive", "--out"]
    assert ran[0][ran[0].index("--max-new-tokens") + 1] == "4"


def test_unknown_phases_are_rejected(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown phases"):
        run_rollout_suite(out_dir=tmp_path, phases=("fast",))


@pytest.mark.slow
def test_a_tiny_suite_runs_every_phase_for_real(tmp_path) -> None:
    pytest.importorskip("torch")
    phases = ("gemm", "roofline", "naive", "engine", "ct2_int8_b32")
    summary = run_rollout_suite(out_dir=tmp_path, phases=phases, threads=1, **TINY)
    by_phase = {r["phase"]: r for r in summary["phases"]}
    assert by_phase["naive"]["episodes"] == 1 and by_phase["engine"]["episodes"] == 2
    for name in ("naive", "engine", "ct2_int8_b32"):
        row = by_phase[name]
        if "skipped" in row:  # CTranslate2 not installed
            continue
        assert row["generated_tokens"] == row["turns"] * 4 and row["tokens_per_s"] > 0
        assert row["peak_rss_gb"] > 0.3
        assert row["of_gemm_limit"] > 0
    assert by_phase["ct2_int8_b32"].get("batch", 2) == 2  # in flight: 2 episodes, not 32
    assert by_phase["roofline"]["tokens_per_s"] > 0
    assert set(by_phase["gemm"]["limits"]) == {"2", "32", "64"}
    assert by_phase["gemm"]["params_per_token"] > 100e6
    assert summary["targets"]["engine_vs_naive"] > 0
