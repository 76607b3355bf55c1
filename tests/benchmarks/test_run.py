"""benchmarks.run end to end in a subprocess (scripted policy: no model)."""

from __future__ import annotations

import json
import subprocess
import sys

from optima_env.io import read_episodes
from tests.helpers import REPO_ROOT


def test_run_writes_episodes_table_and_results(tmp_path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--model", "scripted", "--episodes", "3", "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "| ie/synth-v0 | scripted |" in proc.stdout
    episodes = read_episodes(out / "episodes.jsonl")
    assert len(episodes) == 3 and all(e.reward is not None for e in episodes)
    results = json.loads((out / "results.json").read_text())
    assert results["rows"][0]["episodes"] == 3
    assert results["rows"][0]["mean_tokens"] == sum(e.num_tokens for e in episodes) / 3
    assert "| task | method | score |" in (out / "results.md").read_text()


def test_help_documents_the_flags() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--help"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0
    for flag in ("--task", "--model", "--episodes", "--seed", "--out"):
        assert flag in proc.stdout


def test_unknown_task_is_a_clear_error_not_a_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--task", "nope", "--model", "scripted"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "no task 'nope'; registered:" in proc.stderr
