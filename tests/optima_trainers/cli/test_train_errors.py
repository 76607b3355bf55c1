"""``optima-train`` (``python -m optima_trainers.train``) on a user's mistakes: each bad flag or
setting is one ``error:`` line, exit 2, no traceback (the traceback only with ``--debug``), and no
run folder is left that blocks the corrected command; ``--resume`` refuses flags that change the
stored run; an empty selection stops the run; Ctrl-C says how to resume; one writer per run
folder; and the warnings a mistaken but runnable command gets, each in one line.

Most tests go through the real command in subprocesses; the settings' checks call ``main``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from optima_env.errors import TaskContractError
from optima_trainers.cli.train import main
from optima_trainers.config.train import resolve_config
from optima_trainers.run.folder import RunDir
from tests.helpers import REPO_ROOT, ctrl_c_as_in_a_terminal, one_error_line

TINY_RUN = ("--profile", "cpu", "--instances", "2", "--samples", "1", "--max-turns", "2",
            "--max-new-tokens", "4", "--iterations", "1", "--threads", "1", "--no-progress")  # fmt: skip


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def train(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "optima_trainers.train", *argv],
        cwd=cwd, capture_output=True, text=True, timeout=600, env={**env(), "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip


@pytest.mark.slow
def test_path_flags_are_one_line_and_leave_no_run(tmp_path) -> None:
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    (tmp_path / "configonly").mkdir()
    (tmp_path / "configonly" / "config.json").write_text("{}", encoding="utf-8")
    cases = [
        (["--model", "configonly"], "is not a complete model folder: it has no weights"),
        (["--model", "notamodel"], "--model 'notamodel' is a folder but not a model"),
        (["--model", "./missing"], "--model './missing' does not exist"),
        (["--model", "acme/not-cached-model"], "nor a model in the Hugging Face cache"),
        (["--readability-model", "notamodel"], "--readability-model 'notamodel' is a folder but not a model"),
        (["--run-dir", "afile"], "--run-dir 'afile' is a file"),
        (["--data-dir", "missing"], "--data-dir 'missing': expected an existing folder"),
        (["--resume", "--run-dir", "missing"], "missing is not a run folder (no config.json)"),
        # fails after its folder was made, before the first stage: the folder is removed
        (["--task", "hotpotqa", "--data-dir", "empty", "--run-dir", "runs/x"], "cannot load hotpotqa"),
    ]
    for argv, message in cases:
        assert message in one_error_line(train(*argv, cwd=tmp_path)), argv
    assert not (tmp_path / "runs" / "x").exists()
    assert not any((tmp_path / "runs").glob("*/config.json"))


@pytest.mark.slow
def test_an_empty_selection_stops_the_run_with_what_to_change(tmp_path, tiny_model) -> None:
    proc = train("--model", str(tiny_model), *TINY_RUN, "--theta-sft", "100", cwd=tmp_path)
    line = one_error_line(proc)
    assert "kept none of its 2 scored trajectories" in line and "selection.theta is 100.0" in line
    assert "--theta-sft" in line and "No trajectory scored above 0 on the task" in line
    assert "it/s" not in proc.stderr and "ep/s" not in proc.stderr  # --no-progress: no bar at all


@pytest.mark.slow
def test_ctrl_c_says_how_to_resume(tmp_path, tiny_model) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "optima_trainers.train", "--model", str(tiny_model), *TINY_RUN,
         "--instances", "4", "--samples", "256", "--run-dir", "run"],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True, env={**env(), "PYTHONPATH": str(REPO_ROOT)},
        preexec_fn=ctrl_c_as_in_a_terminal,
    )  # fmt: skip
    episodes = tmp_path / "run" / "iter_00" / "episodes.jsonl"
    deadline = time.monotonic() + 300
    while not (episodes.is_file() and episodes.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.05)  # interrupt once the run holds work (an episode was written)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130
    assert "Traceback" not in rest
    last = rest.strip().splitlines()[-1]
    resume = f"python -m optima_trainers.train --resume --run-dir {tmp_path / 'run'}"
    assert last == f"interrupted; continue with: {resume}"


def test_default_run_names_never_collide(tmp_path) -> None:
    config = resolve_config("ie/synth-v0", "isft", profile="cpu")
    first, second = (RunDir.create(config, base=str(tmp_path)) for _ in range(2))  # same second
    assert first.root != second.root and second.root.name.startswith(first.root.name)


def test_a_run_folder_has_one_writer(tmp_path) -> None:
    run = RunDir.create(resolve_config("ie/synth-v0", "isft", profile="cpu"), run_dir=tmp_path / "run")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys,time; from optima_trainers.run.folder import RunDir\n"
         "with RunDir(sys.argv[1]).lock():\n print('held', flush=True); time.sleep(60)", str(run.root)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, env=env(),
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Exception, match=f"in use by another process \\(pid {holder.pid}\\)"):
            with run.lock():
                pass
    finally:
        holder.kill()
        holder.wait()
    with run.lock():  # the dead holder's lock is taken over
        assert (run.root / ".lock").read_text(encoding="utf-8").strip() == str(os.getpid())


@pytest.mark.slow
def test_iterations_has_one_meaning_stated_in_help_readme_and_the_first_log_line(tmp_path) -> None:
    """The README's stage lists are what the CLI prints for those commands (``--print-config``
    resolves the run and lists its stages without training), and ``--help`` says how to count."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    stated = [line for line in readme.splitlines() if " --iterations " in line and " stages: " in line]
    assert {line.split()[0] for line in stated} == {"isft", "idpo", "isft-dpo"}, stated
    for line in stated:
        trainer, _, count = line.split()[:3]
        proc = train("--trainer", trainer, "--iterations", count.rstrip(":"), "--print-config", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        logged = [entry.split(": ", 1)[1] for entry in proc.stderr.splitlines() if " stages: " in entry]
        assert logged == [line], proc.stderr[-2000:]
    assert not (tmp_path / "runs").exists()
    usage = " ".join(train("--help", cwd=tmp_path).stdout.split())
    assert "the first being the initialization (so 1 trains the initialization alone)" in usage


@pytest.mark.slow
def test_a_selection_without_task_credit_trains_with_a_warning_naming_the_counts(
    tmp_path, tiny_model
) -> None:
    """θ_sft low enough to keep the random model's answers: the stage trains, and the log says
    that what it kept got no task credit (the top 70% of 2 instances is 1 trajectory)."""
    proc = train("--model", str(tiny_model), *TINY_RUN, "--theta-sft", "-100", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line and "task credit" in line]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert "'iter_00': the selection kept 1 trajectories, of which 1 have task score 0" in warnings[0]
    assert "--min-task-score 1e-09" in warnings[0]
    (run,) = (tmp_path / "runs").iterdir()
    assert (run / "iter_00" / "result.json").is_file() and not (run / ".lock").exists()


@pytest.mark.slow
def test_a_paper_sized_run_of_the_embedded_model_warns_in_one_line(tmp_path, tiny_model) -> None:
    for profile in ("paper", "paper-full"):
        proc = train("--profile", profile, "--print-config", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
        assert len(warnings) == 1, proc.stderr[-2000:]
        assert f"--profile {profile} sizes the run for GPUs" in warnings[0]
        assert "name the model to train with --model" in warnings[0]
    named = train("--profile", "paper", "--model", str(tiny_model), "--print-config", cwd=tmp_path)
    assert named.returncode == 0 and "WARNING" not in named.stderr, named.stderr[-2000:]


@pytest.mark.slow
def test_print_config_resolves_an_uncached_hub_model_offline_with_one_warning(tmp_path) -> None:
    """--print-config loads no model, so it prints a configuration for a model this machine has
    not downloaded; the run itself still refuses that model offline."""
    proc = train("--model", "acme/not-cached-model", "--print-config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"model": "acme/not-cached-model"' in proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "--model 'acme/not-cached-model' was not checked" in warnings[0]
    assert "a run here would refuse it" in warnings[0]
    assert "nor a model in the Hugging Face cache" in one_error_line(
        train("--model", "acme/not-cached-model", cwd=tmp_path)
    )
    assert "is a folder but not a model" in one_error_line(
        train("--model", str(tmp_path), "--print-config", cwd=tmp_path)
    )  # a bad path is refused under --print-config as well


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "reward.lambda_token=-1"], "lambda_token must be a number >= 0, got -1.0"),
        (
            ["--set", "selection.theta=abc"],
            "config field 'selection.theta': expected a number (float), got 'abc'",
        ),
        (["--set", "reward.lamda_token=1"], "did you mean reward.lambda_token"),
        (["--set", "sft.lora"], "--set expects NAME=VALUE"),
        (["--lambda-loss", "-2"], "lambda_loss must be a number >= 0"),
        (["--threads", "0"], "--threads must be >= 1"),
    ],
)
def test_bad_settings_are_one_line_errors_before_anything_runs(argv, message, tmp_path, capsys) -> None:
    assert main([*argv, "--runs-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # no run folder was created


def test_debug_shows_the_traceback(tmp_path, capsys) -> None:
    assert main(["--set", "reward.lambda_token=-1", "--debug", "--runs-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err  # the traceback, then the one line (optima_env.cli_support)
    assert "Traceback (most recent call last)" in err and "ConfigError" in err
    assert err.strip().splitlines()[-1].startswith("error: ") and "lambda_token" in err.splitlines()[-1]


def test_resume_refuses_flags_that_change_the_stored_config(tmp_path: Path, capsys) -> None:
    config = resolve_config("ie/synth-v0", "idpo", seed=3)
    RunDir.create(config, run_dir=tmp_path / "run")
    assert main(["--resume", "--run-dir", str(tmp_path / "run"), "--seed", "4"]) == 2
    assert "'seed': (3, 4)" in capsys.readouterr().err
    assert main(["--resume", "--run-dir", str(tmp_path / "run"), "--set", "dpo.beta=0.3"]) == 2
    assert "'dpo.beta': (0.1, 0.3)" in capsys.readouterr().err
    assert main(["--resume", "--run-dir", str(tmp_path / "run"), "--trainer", "isft"]) == 2
    assert "holds a run of ie/synth-v0 / idpo, not ie/synth-v0 / isft" in capsys.readouterr().err
    with pytest.raises(TaskContractError, match="already holds a run"):
        RunDir.create(config, run_dir=tmp_path / "run")


def test_unknown_trainer_is_a_clear_error(capsys) -> None:
    assert main(["--trainer", "ppo", "--print-config"]) == 2
    assert "installed: grpo, idpo, isft, isft-dpo" in capsys.readouterr().err
