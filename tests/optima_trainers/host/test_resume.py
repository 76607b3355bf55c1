"""Crash and resume: a run SIGKILLed mid-generation, right after selection, mid-training and
mid-save, then resumed, ends with exactly the data (and weights) of an uninterrupted run with the
same seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optima_trainers.run.checkpoint import require_complete
from tests.helpers import REPO_ROOT
from tests.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow

ARGS = [
    "--task", "ie/synth-v0", "--trainer", "isft", "--profile", "cpu", "--iterations", "1", "--backend", "hf",
    "--instances", "3", "--samples", "2", "--max-turns", "2", "--max-new-tokens", "8",
    "--concurrency", "2", "--max-steps", "1", "--theta-sft", "-100", "--no-progress",
]  # fmt: skip


SECRET = "sk-test-SECRET-d41d8cd9"  # in the environment of every run: it must be written nowhere


def train(run_dir: Path, model: Path, *, resume: bool = False, fault: str | None = None) -> int:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OPENAI_API_KEY": SECRET}
    env.pop("OPTIMA_FAULT", None)
    if fault:
        env["OPTIMA_FAULT"] = fault
    args = (
        ["--resume", "--run-dir", str(run_dir)]
        if resume
        else [*ARGS, "--model", str(model), "--run-dir", str(run_dir)]
    )
    done = subprocess.run(
        [sys.executable, "-m", "optima_trainers.train", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode not in (0, -9):
        raise AssertionError(f"train exited {done.returncode}:\n{done.stderr[-3000:]}")
    assert SECRET not in done.stdout + done.stderr
    return done.returncode


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def by_job(path: Path) -> dict[tuple[int, int], dict]:
    records = [json.loads(line) for line in lines(path)]
    return {tuple(r["metadata"]["job"]): r for r in records}


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_killed_and_resumed_run_equals_uninterrupted_run(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    model = make_tiny_model(tmp_path / "tiny")
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    assert train(clean, model) == 0

    # 1. killed mid-generation, after the 3rd of 6 episodes was appended
    assert train(crashed, model, fault="episode:3") == -9
    stage = crashed / "iter_00"
    first = lines(stage / "episodes.jsonl")
    assert len(first) == 3 and not (stage / "scored.jsonl").exists()

    reference = clean / "iter_00"

    # 2. resumed, killed after selection (phases generate, score, select), before training starts
    assert train(crashed, model, resume=True, fault="phase:3") == -9
    episodes = lines(stage / "episodes.jsonl")
    assert episodes[:3] == first  # finished episodes were kept, not regenerated
    assert len(episodes) == 6 and len(by_job(stage / "episodes.jsonl")) == 6  # none lost, none duplicated
    assert json.loads((crashed / "state.json").read_text())["phase"] == "select"
    assert lines(stage / "selected.jsonl") == lines(reference / "selected.jsonl")
    assert not (stage / "checkpoint").exists() and not (stage / ".checkpoint.tmp-write").exists()
    selected = (stage / "selected.jsonl").read_bytes()

    # 3. resumed, killed after the first optimizer step (before any checkpoint exists)
    assert train(crashed, model, resume=True, fault="train_step:1") == -9
    assert lines(stage / "episodes.jsonl") == episodes  # nothing regenerated, nothing appended
    assert (stage / "selected.jsonl").read_bytes() == selected  # the selection was reused as is
    assert not (stage / "checkpoint").exists()

    # 4. resumed, killed after the weights were written but before the COMPLETE marker
    assert train(crashed, model, resume=True, fault="checkpoint:1") == -9
    partial = stage / ".checkpoint.tmp-write"
    assert (partial / "model.safetensors").exists() and not (partial / "COMPLETE").exists()
    assert not (stage / "checkpoint").exists()

    # 5. resumed to the end: the partial checkpoint was discarded and retrained
    assert train(crashed, model, resume=True) == 0
    assert (stage / "checkpoint" / "COMPLETE").exists() and not partial.exists()
    assert require_complete(stage / "checkpoint").steps == 1  # its manifest matches its files
    assert by_job(stage / "episodes.jsonl") == by_job(reference / "episodes.jsonl")
    assert lines(stage / "scored.jsonl") == lines(reference / "scored.jsonl")
    assert lines(stage / "selected.jsonl") == lines(reference / "selected.jsonl")
    assert len(lines(stage / "selected.jsonl")) == 2  # int(0.7 * 3) instances, threshold open
    import torch

    resumed, uninterrupted = weights(stage / "checkpoint"), weights(reference / "checkpoint")
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.allclose(resumed[k], uninterrupted[k], atol=1e-6) for k in resumed)
    assert not all(torch.equal(uninterrupted[k], weights(model)[k]) for k in uninterrupted)  # it trained
    metrics = [json.loads(line) for line in lines(crashed / "metrics.jsonl")]
    assert [m["stage"] for m in metrics] == ["iter_00"]
    for path in [*clean.rglob("*"), *crashed.rglob("*")]:  # config, state, logs, checkpoints, events
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path
