"""A third-party trainer package (``examples/optima_trainer_rft``), installed through its ``optima``
entry point, is listed by ``--help`` with its options and trains from the CLI like a built-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.slow  # runs a real model: the full suite only

PACKAGE = REPO_ROOT / "examples" / "optima_trainer_rft"


def _install(site: Path) -> dict[str, str]:
    """Install the example the way pip does (a ``.dist-info`` with its entry points on the path)."""
    dist = site / "optima_trainer_rft-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: optima-trainer-rft\nVersion: 0.1.0\n")
    entry = (
        (PACKAGE / "pyproject.toml").read_text().split("[project.entry-points.optima]\n")[1].splitlines()[0]
    )
    assert entry == 'rft = "optima_trainer_rft"'  # the package's own declaration
    (dist / "entry_points.txt").write_text("[optima]\nrft = optima_trainer_rft\n")
    path = os.pathsep.join([str(site), str(PACKAGE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "optima_trainers.train", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def test_help_lists_an_installed_third_party_trainer_and_its_options(tmp_path: Path) -> None:
    env = _install(tmp_path / "site")
    done = _cli(env, "--help")
    assert done.returncode == 0, done.stderr
    assert "  rft        Rejection-sampling fine-tuning" in done.stdout
    assert "--set options.min_task_score=...  Keep a conversation only if its task score" in done.stdout
    assert "--set options.per_instance=..." in done.stdout
    bad = _cli(env, "--trainer", "rft", "--set", "options.per_instance=0", "--print-config")
    assert bad.returncode == 2 and "per_instance must be >= 1, got 0" in bad.stderr
    unknown = _cli(env, "--trainer", "rft", "--set", "options.per_instanse=2", "--print-config")
    assert unknown.returncode == 2 and "did you mean options.per_instance" in unknown.stderr
    ok = _cli(env, "--trainer", "rft", "--set", "options.per_instance=2", "--print-config")
    assert json.loads(ok.stdout)["options"] == {"min_task_score": 1.0, "per_instance": 2}
    without = _cli({**env, "PYTHONPATH": ""}, "--trainer", "rft", "--print-config")
    assert (
        without.returncode == 2
        and "no trainer 'rft'; installed: grpo, idpo, isft, isft-dpo" in without.stderr
    )


@pytest.mark.slow
def test_a_third_party_trainer_trains_one_iteration_from_the_cli(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from tests.tiny_model import make_tiny_model

    env = _install(tmp_path / "site")
    model = make_tiny_model(tmp_path / "tiny")
    run = tmp_path / "run"
    done = _cli(
        env, "--trainer", "rft", "--task", "ie/synth-v0", "--model", str(model), "--profile", "cpu",
        "--instances", "2", "--samples", "2", "--max-turns", "2", "--max-new-tokens", "8", "--max-steps", "1",
        "--set", "options.min_task_score=0", "--set", "options.per_instance=1", "--run-dir", str(run),
        "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((run / "iter_00" / "result.json").read_text())
    assert result["model"] == "iter_00/checkpoint" and (run / "iter_00" / "checkpoint" / "COMPLETE").is_file()
    metrics = result["metrics"]
    assert metrics["rft/accepted"] == 2  # one per instance: the backend's own rule, not iSFT's top 70%
    assert metrics["train/steps"] == 1 and metrics["rollout/episodes"] == 4
    assert json.loads((run / "config.json").read_text())["trainer"] == "rft"
