"""``optima-rollout-bench`` (``python -m benchmarks.throughput.rollout_bench``) on a user's
mistakes, through the real command in subprocesses: each bad flag is one ``error:`` line, exit 2,
no traceback, and no ``--out`` folder is left."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import REPO_ROOT, one_error_line


def test_the_rollout_benchmark_cli_answers_bad_flags_in_one_line(tmp_path) -> None:
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    cases = [
        (["--model", str(tmp_path / "missing")], "--model"),
        (["--episodes", "0"], "--episodes must be at least 1, got 0"),
        (["--out", str(tmp_path / "afile")], "--out"),
    ]
    for argv, message in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.throughput.rollout_bench", "--out", str(tmp_path / "out"),
             *argv],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        )
        assert message in one_error_line(proc), argv
        assert not (tmp_path / "out").exists()
