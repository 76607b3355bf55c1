"""The documentation's snippets that train or run a model run as written, offline, on the embedded
model: the README's Quick start and the TRL GRPO snippet of the reuse guide (extracted from the
pages; only their sizes are shrunk, each replaced string checked to be there, so an edit that
drops it fails here)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.docs import DOCS, README, code_block
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.slow  # runs a real model: the full suite only


def shrunk(code: str, replacements: dict[str, str], *, twice: tuple[str, ...] = ()) -> str:
    """``code`` with each ``old`` replaced; each must occur once (those in ``twice``: twice)."""
    for old, new in replacements.items():
        expected = 2 if old in twice else 1
        assert code.count(old) == expected, f"{old!r} is not {expected}x in the snippet"
        code = code.replace(old, new)
    return code


def run_python(code: str, cwd) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", "import torch; torch.set_num_threads(1)\n" + code],
        cwd=cwd, capture_output=True, text=True, timeout=900,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_quick_start_runs_and_reproduces(tmp_path) -> None:
    code = shrunk(
        code_block(README, "Quick start", "rollout("),
        {"range(8)": "range(2)", "max_new_tokens=96": "max_new_tokens=12", "max_turns=4": "max_turns=2"},
    )
    assert "seed=0)" in code and 'TransformersPolicy.from_pretrained("embedded")' in code
    first, second = run_python(code, tmp_path), run_python(code, tmp_path)
    assert first == second  # sampled at temperature 0.7, yet the same episodes: the seed is set
    assert "RewardBreakdown(" in first  # the scripted episode's reward was printed


def test_the_grpo_snippet_trains_offline_with_readability(tmp_path) -> None:
    code = shrunk(
        code_block(DOCS / "guides" / "reuse.md", "TRL's GRPO", "GRPOTrainer"),
        {
            "range(64)": "range(1)",
            'output_dir="grpo",': 'output_dir="grpo", max_steps=1, save_strategy="no", use_cpu=True,',
            "max_new_tokens=64": "max_new_tokens=8",
            "max_turns=4": "max_turns=2",
            "num_generations=4": "num_generations=2",  # the rollout's and GRPO's
            "per_device_train_batch_size=8": "per_device_train_batch_size=2",
        },
        twice=("num_generations=4",),
    )
    assert 'load_model("embedded")' in code and "readability=TransformersLMLoss" in code
    code += (
        "\nterms = [e.reward for g in rollout.episodes.values() for e in g]"
        "\nprint('episodes', len(terms), 'no_readability', sum('no_readability' in r.flags for r in terms))"
    )
    out = run_python(code, tmp_path).strip().splitlines()[-1].split()
    assert out[0] == "episodes" and int(out[1]) > 0
    assert out[2:] == ["no_readability", "0"]  # every episode's readability was scored
