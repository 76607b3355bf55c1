"""The command line, the run folder and atomic checkpoints (no model needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from optima_env.errors import DataError, TaskContractError
from optima_trainers.checkpoint import (
    TrainResult,
    atomic_checkpoint,
    discard_partial,
    is_complete,
    require_complete,
)
from optima_trainers.cli import main
from optima_trainers.config import resolve_config
from optima_trainers.runs import RunDir
from tests.helpers import REPO_ROOT


def test_help_lists_the_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "optima_trainers.train", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0
    for flag in ("--task", "--trainer", "--model", "--iterations", "--resume", "--run-dir", "--backend",
                 "--instances", "--samples", "--report-to", "--preset", "--profile"):  # fmt: skip
        assert flag in done.stdout


def test_print_config_resolves_preset_and_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--task", "synth", "--trainer", "idpo", "--profile", "cpu", "--samples", "3",
                 "--set", "theta_diff=0.3", "--print-config"]) == 0  # fmt: skip
    import json

    config = json.loads(capsys.readouterr().out)
    assert config["task"] == "ie/synth-v0" and config["num_samples"] == 3 and config["theta_diff"] == 0.3


def test_resume_refuses_flags_that_change_the_stored_config(tmp_path: Path, capsys) -> None:
    config = resolve_config("ie/synth-v0", "idpo", seed=3)
    RunDir.create(config, run_dir=tmp_path / "run")
    assert main(["--resume", "--run-dir", str(tmp_path / "run"), "--seed", "4"]) == 2
    assert "differ" in capsys.readouterr().err
    assert main(["--resume", "--run-dir", str(tmp_path / "run"), "--trainer", "isft"]) == 2
    assert "'trainer': ('idpo', 'isft')" in capsys.readouterr().err
    with pytest.raises(TaskContractError, match="already holds a run"):
        RunDir.create(config, run_dir=tmp_path / "run")


def test_unknown_trainer_is_a_clear_error(capsys) -> None:
    assert main(["--trainer", "ppo", "--print-config"]) == 2
    assert "registered: idpo, isft, isft-dpo" in capsys.readouterr().err


def test_atomic_checkpoint_appears_complete_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    with pytest.raises(RuntimeError), atomic_checkpoint(target) as (tmp, finish):
        (tmp / "model.safetensors").write_text("half")
        raise RuntimeError("killed while saving")
    assert not target.exists() and not list(tmp_path.iterdir())
    result = TrainResult(checkpoint=str(target), train_loss=0.5, steps=2, num_examples=4, metrics={"x": 1.0})
    with atomic_checkpoint(target) as (tmp, finish):
        (tmp / "model.safetensors").write_text("whole")
        finish(result)
    assert is_complete(target) and require_complete(target) == result


def test_partial_checkpoint_is_never_loaded(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "model.safetensors").write_text("half")
    assert not is_complete(target)
    with pytest.raises(DataError, match="not a complete checkpoint"):
        require_complete(target)
    assert discard_partial(target) and not target.exists()
