"""A checkpoint from a training run folder is evaluated under the rules it was trained by: the
run's task arguments and caps, unless a flag overrides them; the report says which caps were used.
Through the real CLIs: a tiny model trained by ``optima_trainers.train``, then ``benchmarks.run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow  # runs a real model: the full suite only

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join((str(REPO_ROOT), str(REPO_ROOT / "plugins")))}  # fmt: skip


def cli(module: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=ENV)  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """(the tiny base model, the checkpoint of a run on ie/synth-v0 with hops=3, 2 turns x 5 tokens)."""
    root = tmp_path_factory.mktemp("trained")
    tiny = make_tiny_model(root / "tiny")
    proc = cli("optima_trainers.train", "--model", str(tiny), "--task", "ie/synth-v0", "--profile", "cpu",
               "--instances", "2", "--samples", "1", "--max-turns", "2", "--max-new-tokens", "5",
               "--iterations", "1", "--theta-sft", "-100", "--threads", "1", "--no-progress",
               "--set", 'task_kwargs={"hops": 3}', "--run-dir", str(root / "run"), cwd=root)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tiny, root / "run" / "iter_00" / "checkpoint"


def bench(tiny: Path, checkpoint: Path, out: Path, *flags: str) -> tuple[dict, str]:
    proc = cli("benchmarks.run", "--model", str(tiny), "--task", "ie/synth-v0", "--methods", "cot",
               "--episodes", "1", "--checkpoint", f"T={checkpoint}", "--out", str(out), "--no-progress",
               *flags, cwd=out.parent)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), (out / "report.md").read_text()


def test_a_run_folders_checkpoint_plays_by_its_runs_task_arguments_and_caps(trained, tmp_path) -> None:
    tiny, checkpoint = trained
    results, report = bench(tiny, checkpoint, tmp_path / "as-trained")
    settings = results["settings"]
    caps = (settings["max_turns"], settings["max_new_tokens"], settings["stop_at_speaker_tags"])
    assert caps == (2, 5, True)
    assert results["tasks"][0]["task_kwargs"] == {"hops": 3}
    run = checkpoint.parent.parent
    caps = "2 turns x 5 tokens, turns cut at speaker tags"
    assert f"- **caps**: {caps}, from the training run of T: {run}\n" in report
    assert "- **task arguments**: ie/synth-v0 {'hops': 3}\n" in report
    lines = (tmp_path / "as-trained" / "episodes.jsonl").read_text().splitlines()
    episodes = [json.loads(line) for line in lines]
    trained_rows = [e for e in episodes if e["metadata"]["method"].startswith("ckpt:")]
    assert trained_rows and all(len(e["turns"]) <= 2 for e in trained_rows)


def test_flags_override_the_runs_rules_and_the_report_says_so(trained, tmp_path) -> None:
    tiny, checkpoint = trained
    flags = ("--max-turns", "3", "--task-arg", "hops=2")
    results, report = bench(tiny, checkpoint, tmp_path / "overridden", *flags)
    assert (results["settings"]["max_turns"], results["settings"]["max_new_tokens"]) == (3, 5)
    assert results["tasks"][0]["task_kwargs"] == {"hops": 2}
    assert "3 turns x 5 tokens, turns cut at speaker tags, from the training run of T: " in report
    assert ", except --max-turns\n" in report


def test_a_checkpoint_outside_a_run_folder_plays_by_the_suite(trained, tmp_path) -> None:
    tiny, _ = trained
    results, report = bench(tiny, tiny, tmp_path / "suite")
    assert results["tasks"][0]["task_kwargs"] == {}
    assert ", from the suite\n" in report
