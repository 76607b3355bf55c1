"""``optima-bench`` (``python -m benchmarks.run``) on a user's mistakes: each bad flag is one
``error:`` line, exit 2, no traceback (the traceback only with ``--debug``), and no ``--out`` folder
is left; an unknown task, suite or method names what exists; a URL given as ``--model`` says which
flags serve an OpenAI-compatible server; a malformed data file is a data error naming file, line
and field (not "data missing"); one writer per ``--out``; Ctrl-C prints the command that resumes.

Most tests go through the real command in subprocesses; the OpenAI flags' checks call ``main``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.run import main
from tests.helpers import REPO_ROOT, ctrl_c_as_in_a_terminal, one_error_line

URL = "http://127.0.0.1:8000/v1"


def bench(*argv: str, cwd=REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.run", *argv],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_url_as_model_is_one_clear_line_and_exit_code_2(tmp_path) -> None:
    proc = bench("--model", URL, "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and proc.stderr.rstrip().endswith(lines[0])
    assert f"--model '{URL}' is a URL" in lines[0]
    assert f"pass --backend openai --base-url {URL} --model <the model name the server serves>" in lines[0]


def test_debug_adds_the_traceback(tmp_path) -> None:
    proc = bench("--model", URL, "--debug", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr and "TaskContractError" in proc.stderr
    assert len(error_lines(proc.stderr)) == 1


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--backend", "openai", "--model", "served-model"],
            "--backend openai needs the server: add --base-url",
        ),
        (["--base-url", URL, "--model", "embedded"], "--base-url is for --backend openai"),
        (["--backend", "openai", "--base-url", URL, "--model", URL], "is a URL"),
        (
            ["--backend", "openai", "--base-url", "ftp://x", "--model", "m"],
            "base_urls must be one or more http",
        ),
    ],
)
def test_openai_flag_mistakes_are_one_line_errors(tmp_path, capsys, flags, message) -> None:
    code = main([*flags, "--task", "ie/synth-v0", "--episodes", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert len(error_lines(err)) == 1 and message in error_lines(err)[0]


def test_unknown_task_is_a_clear_error_not_a_traceback() -> None:
    proc = bench("--task", "nope", "--model", "scripted")
    assert proc.returncode == 2 and "no task 'nope'; registered:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_suite_and_method_are_clear_errors(tmp_path) -> None:
    proc = bench("--suite", "nope", "--model", "scripted", "--out", str(tmp_path / "a"))
    assert proc.returncode == 2 and "no suite 'nope'; expected one of main, smoke, paper" in proc.stderr
    proc = bench("--methods", "cot,tot", "--model", "scripted", "--out", str(tmp_path / "b"))
    assert proc.returncode == 2 and "unknown method 'tot'" in proc.stderr


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


@pytest.mark.slow
def test_ctrl_c_prints_the_command_that_resumes(tmp_path) -> None:
    import signal
    import time

    from tests.tiny_model import make_tiny_model

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
