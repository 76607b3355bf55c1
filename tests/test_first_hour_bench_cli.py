"""``python -m benchmarks.run`` on a new user's mistakes (issue 32), through the real CLI in
subprocesses: one ``error:`` line, exit 2, no traceback, no ``--out`` folder left; a malformed data
file is a data error naming file, line and field (not "data missing"); one writer per ``--out``;
the main suite's demo adapters play only on the task they were trained on."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest

from benchmarks.demo.tasks import MAIN_TASK
from benchmarks.run import _suite_adapters
from benchmarks.suites import get_suite
from tests.helpers import REPO_ROOT, ctrl_c_as_in_a_terminal


def bench(*argv: str, cwd=REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.run", *argv],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and proc.stderr.rstrip().endswith(lines[0]), proc.stderr[-2000:]
    return lines[0]


@pytest.mark.slow
def test_each_mistake_is_one_line_and_leaves_no_folder(tmp_path) -> None:
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    out = tmp_path / "out"
    cases = [
        (["--episodes", "0"], "--episodes must be at least 1 (instances per task), got 0"),
        (["--episodes", "-3"], "--episodes must be at least 1 (instances per task), got -3"),
        (["--model", str(tmp_path / "notamodel")], "is a folder but not a model"),
        (["--model", str(tmp_path / "missing")], "does not exist"),
        (["--model", f"Alice=embedded,Bob={tmp_path / 'missing'}"], "--model (agent Bob)"),
        (["--checkpoint", f"mine={tmp_path / 'missing'}"], "--checkpoint mine=PATH:"),
        (["--data-dir", str(tmp_path / "missing")], "--data-dir"),
    ]
    for argv, message in cases:
        assert message in one_error_line(bench(*argv, "--methods", "cot", "--out", str(out))), argv
        assert not out.exists(), argv
    assert "--out" in one_error_line(bench("--model", "scripted", "--out", str(tmp_path / "afile")))


def test_a_malformed_data_file_is_a_data_error_not_missing_data(tmp_path) -> None:
    (tmp_path / "hotpotqa").mkdir()
    (tmp_path / "hotpotqa" / "dev.jsonl").write_text('{"id": "x", "question": 5, "answer": "a"}\n')
    line = one_error_line(
        bench("--task", "hotpotqa", "--data-dir", str(tmp_path), "--model", "scripted", "--episodes", "1",
              "--methods", "cot", "--out", str(tmp_path / "out"))
    )  # fmt: skip
    assert (
        line
        == f"error: {tmp_path / 'hotpotqa' / 'dev.jsonl'}, line 1: field 'question': expected str, got int"
    )


def test_one_writer_per_out_folder(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys,time; from optima_env.paths import folder_lock\n"
         "with folder_lock(sys.argv[1], what='--out'):\n print('held', flush=True); time.sleep(60)",
         str(out)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        line = one_error_line(
            bench("--model", "scripted", "--methods", "cot", "--episodes", "1", "--out", str(out))
        )
        assert f"--out {out} is in use by another process (pid {holder.pid})" in line
        assert not (out / "episodes.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    assert (out / ".lock").read_text().strip() == str(holder.pid)  # killed: it could not let go
    proc = bench("--model", "scripted", "--methods", "cot", "--episodes", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "episodes.jsonl").exists() and not (out / ".lock").exists()  # taken over, then removed


@pytest.mark.parametrize("tasks, played", [([MAIN_TASK.task], True), (["test/tiny-v0"], False)])
def test_main_suite_adapters_play_only_on_their_task(tasks, played, monkeypatch) -> None:
    suite = replace(get_suite("main"), adapters=(("iSFT", "adapters/isft"), ("iDPO", "adapters/idpo")))
    monkeypatch.setattr("benchmarks.run.is_adapter", lambda folder: True)  # as if the demo had run
    adapters = _suite_adapters(suite, tasks)
    assert (sorted(adapters) == sorted(label for label, _ in suite.adapters)) is played
    assert bool(adapters) is played


def test_the_rollout_benchmark_cli_answers_bad_flags_in_one_line(tmp_path) -> None:
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    cases = [
        (["--model", str(tmp_path / "missing")], "--model"),
        (["--episodes", "0"], "--episodes must be at least 1, got 0"),
        (["--out", str(tmp_path / "afile")], "--out"),
    ]
    for argv, message in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.throughput.rollout_bench", "--out", str(tmp_path / "out"),
             *argv],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        )
        assert message in one_error_line(proc), argv
        assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_no_progress_silences_every_bar_and_help_names_per_agent_models(tmp_path) -> None:
    flags = ("--model", "scripted", "--methods", "cot", "--episodes", "2")
    shown = bench(*flags, "--out", str(tmp_path / "a"))
    quiet = bench(*flags, "--no-progress", "--out", str(tmp_path / "b"))
    assert shown.returncode == quiet.returncode == 0, quiet.stderr[-2000:]
    assert "ep/s" in shown.stderr  # the rollout's bar, on by default
    assert "ep/s" not in quiet.stderr and "it/s" not in quiet.stderr
    help_text = bench("--help").stdout
    assert "AGENT=MODEL[,AGENT=MODEL...]" in help_text and "--no-progress" in help_text


@pytest.mark.slow
def test_ctrl_c_prints_the_command_that_resumes(tmp_path) -> None:
    import signal
    import time

    from tests.optima_trainers.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    argv = ["--model", str(model), "--task", "ie/synth-v0", "--methods", "mad", "--episodes", "30",
            "--max-new-tokens", "8", "--concurrency", "1", "--threads", "1", "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.run", *argv, "--out", str(out)],
        cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        preexec_fn=ctrl_c_as_in_a_terminal,
    )  # fmt: skip
    episodes = out / "episodes.jsonl"
    deadline = time.monotonic() + 300
    while not (episodes.is_file() and episodes.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, rest[-2000:]
    assert "Traceback" not in rest
    last = rest.strip().splitlines()[-1]
    assert last.startswith("interrupted; finished episodes are kept: rerun python -m benchmarks.run ")
    assert f"--out {out} " in last and "--methods mad" in last and last.endswith(" to resume")
