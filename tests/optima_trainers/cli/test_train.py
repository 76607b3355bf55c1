"""``optima-train`` (``python -m optima_trainers.train``) as documented: ``--help`` lists every
option, installed trainer and configuration field, and ``--print-config`` resolves the preset and
the flags without training. Its answers to mistakes: ``test_train_errors.py``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from optima_trainers.cli.train import main
from optima_trainers.config.train import TrainConfig
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
                 "--instances", "--samples", "--report-to", "--preset", "--profile", "--set",
                 "--lambda-token", "--threads", "--debug"):  # fmt: skip
        assert flag in done.stdout
    # the installed trainers and every configuration field, typed, with its documentation
    assert "installed trainers (--trainer NAME):" in done.stdout
    for name in ("isft ", "idpo ", "isft-dpo ", "grpo "):
        assert f"  {name}" in done.stdout
    assert "reward.lambda_token (float, 0.6): λ_token" in done.stdout
    assert "tree.lambda_token (float | None, None): The tree reward's own λ_token" in done.stdout


def test_print_config_resolves_preset_and_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--task", "synth", "--trainer", "idpo", "--profile", "cpu", "--samples", "3",
                 "--set", "tree.theta_diff=0.3", "--set", "sft.lora=false", "--lambda-token", "0.25",
                 "--print-config"]) == 0  # fmt: skip
    import json

    config = json.loads(capsys.readouterr().out)
    assert config["task"] == "ie/synth-v1" and config["generation"]["num_samples"] == 3  # the latest version
    assert config["tree"]["theta_diff"] == 0.3 and config["sft"]["lora"] is False
    # one home: the tree reward follows reward.* (tree.lambda_token unset)
    assert config["reward"]["lambda_token"] == 0.25 and config["tree"]["lambda_token"] is None
    assert TrainConfig.from_dict(config).tree_reward.lambda_token == 0.25
