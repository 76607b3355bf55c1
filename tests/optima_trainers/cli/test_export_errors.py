"""``optima-export`` (``python -m optima_trainers.cli.export``) on a user's mistakes, through the
real command in subprocesses: each bad flag is one ``error:`` line, exit 2, no traceback, and no
adapter folder is left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT, one_error_line


def export(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "optima_trainers.cli.export", *argv],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip


def test_the_export_cli_answers_bad_flags_in_one_line(tmp_path, tiny_model) -> None:
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    cases = [
        (["--model", "./missing"], "--model './missing' does not exist"),
        (["--model", "notamodel"], "--model 'notamodel' is a folder but not a model"),
        (["--model", str(tiny_model), "--base", "./missing"], "--base './missing' does not exist"),
        (["--model", str(tiny_model), "--rank", "0"], "--rank must be at least 1"),
    ]
    for argv, message in cases:
        proc = export("--out", "adapter", *argv, cwd=tmp_path)
        assert message in one_error_line(proc), argv
        assert not (tmp_path / "adapter").exists()
    proc = export("--model", str(tiny_model), "--out", "afile", cwd=tmp_path)
    assert "--out 'afile' is a file" in one_error_line(proc)
