"""The documentation's GPU training commands each name a model other than the embedded one.

The commands are extracted from the bash blocks of the README and the site's pages and run as
written (through bash, so ``$(...)`` expands as it would for a user) with ``--print-config``
appended: the trainer resolves the configuration exactly as the run would and prints it without
loading a model, so a hub model that is not in the offline cache is resolved too (with one
warning that it was not checked).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs import code_blocks, pages, text
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.slow  # runs a real model: the full suite only

TRAIN = "-m optima_trainers.train "
GPU_FLAGS = ("--profile paper", "--backend vllm", "--backend openai", "--full-finetune")
"""A trainer command with one of these is sized or built for GPUs."""
SHARED = " /shared/"
"""The multi-machine examples' shared file system, mapped into the test's folder."""


def documented_train_commands() -> list[str]:
    """Every ``optima_trainers.train`` command of the documentation's bash blocks, its
    continuation lines joined and its whitespace collapsed to single spaces."""
    commands = []
    for block in (b for page in pages() for b in code_blocks(text(page), "bash")):
        for line in block.replace("\\\n", " ").splitlines():
            if TRAIN in line and not line.lstrip().startswith("#"):
                commands.append(" ".join(line.split()))
    return commands


def trainer_args(command: str) -> str:
    """The trainer's own arguments: what follows ``-m optima_trainers.train`` (the launcher before
    it, ``python`` or ``accelerate launch ...``, dropped)."""
    return command.split(TRAIN, 1)[1]


def print_config(args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m optima_trainers.train ARGS --print-config`` through bash, offline."""
    python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        ["bash", "-c", f"{sys.executable} {TRAIN}{args} --print-config"],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": python_path},
    )  # fmt: skip


def models_of(config: dict) -> list[str]:
    """Every model the resolved configuration would load: the run's, the readability scorer's
    (``None``: the run's) and the fixed roles'."""
    models = [config["model"], config["readability_model"] or config["model"]]
    return models + list(config["generation"]["agent_models"].values())


def test_every_documented_gpu_command_resolves_to_a_named_model(tmp_path) -> None:
    gpu = [c for c in documented_train_commands() if any(flag in c for flag in GPU_FLAGS)]
    assert any(c.startswith("python ") for c in gpu), gpu  # the one-GPU commands were found
    assert sum(c.startswith("accelerate launch ") for c in gpu) >= 3, gpu  # and the launched ones
    for command in gpu:
        args = trainer_args(command)
        if SHARED in args:
            args = args.replace(SHARED, f" {tmp_path}/shared/")
        proc = print_config(args, tmp_path)
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
        config = json.loads(proc.stdout)
        assert "embedded" not in models_of(config), command
        assert "the embedded 135M one" not in proc.stderr, command
    assert not (tmp_path / "runs").exists() and not (tmp_path / "shared").exists()  # nothing was run
