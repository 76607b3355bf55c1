"""examples/reinforce_synth.py: the optima env driving a plain REINFORCE loop (not Optima's trainers)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow


def _example():
    spec = importlib.util.spec_from_file_location(
        "reinforce_synth", REPO_ROOT / "examples" / "reinforce_synth.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_reinforce_steps_change_the_parameters(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    folder = make_tiny_model(tmp_path / "tiny")
    before = load_file(str(folder / "model.safetensors"))
    example = _example()
    args = example.parse_args(
        ["--model", str(folder), "--steps", "2", "--episodes", "2", "--max-turns", "2",
         "--max-new-tokens", "6", "--lr", "1e-3"]
    )  # fmt: skip
    model, history = example.train(args)
    assert len(history) == 2 and all(math.isfinite(h["train/loss"]) for h in history)
    after = model.state_dict()
    changed = [k for k, v in before.items() if not torch.equal(v, after[k].detach().cpu())]
    assert changed, "no parameter moved"
