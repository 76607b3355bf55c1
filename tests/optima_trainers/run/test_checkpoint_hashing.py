"""Checkpoints are hashed once: by the writer as it writes them; the loop does not hash
a checkpoint it wrote again before the next stage loads it, and a resumed run verifies the one it
did not write (the corruption checks of the resume tests still hold)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from optima_trainers.run import checkpoint

pytestmark = pytest.mark.slow  # runs a real model: the full suite only


def test_each_checkpoint_file_is_hashed_once_in_a_two_stage_run(tmp_path, monkeypatch) -> None:
    pytest.importorskip("trl")
    from optima_trainers import IterativeTrainer, RunDir, resolve_config
    from tests.tiny_model import make_tiny_model

    hashed: Counter[Path] = Counter()
    real = checkpoint.file_sha256

    def counting(path: Path, **kwargs):  # the real hash, counted per file
        hashed[Path(path)] += 1
        return real(path, **kwargs)

    monkeypatch.setattr(checkpoint, "file_sha256", counting)
    model = make_tiny_model(tmp_path / "tiny")
    sizes = {"generation.instances": 2, "generation.num_samples": 2, "generation.max_turns": 2,
             "generation.max_new_tokens": 8, "sft.max_steps": 1, "selection.theta": -100.0}  # fmt: skip
    config = resolve_config(
        "ie/synth-v0", "isft", profile="cpu", model=str(model), iterations=2, overrides=sizes
    )
    run = RunDir.create(config, run_dir=tmp_path / "run")
    IterativeTrainer(config, run_dir=run, progress=False).run()
    weights = [p for p in hashed if p.name == "model.safetensors"]  # adapter/ holds its own
    assert {p.parent.parent.name for p in weights} == {"iter_00", "iter_01"}  # both stages wrote one
    assert all(hashed[p] == 1 for p in hashed), hashed  # the writer's hash, nothing else
