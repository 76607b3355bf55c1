"""The recorded git commit: HEAD, ``-dirty`` when tracked code differs, ``None`` outside a checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

from optima_trainers.run.provenance import git_commit


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_the_commit_is_heads_and_says_dirty_when_a_tracked_file_differs(tmp_path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "train.py").write_text("v1\n", encoding="utf-8")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text("v1\n", encoding="utf-8")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert len(head) == 40 and git_commit(tmp_path) == head
    (tmp_path / "notes.txt").write_text("untracked\n", encoding="utf-8")
    assert git_commit(tmp_path) == head  # an untracked file is not code that ran
    (tmp_path / "out" / "results.json").write_text("v2\n", encoding="utf-8")
    assert git_commit(tmp_path) == f"{head}-dirty"
    assert git_commit(tmp_path, ignore=("out/",)) == head  # a run's own output does not count
    (tmp_path / "train.py").write_text("v2\n", encoding="utf-8")
    assert git_commit(tmp_path, ignore=("out/",)) == f"{head}-dirty"


def test_outside_a_checkout_or_before_the_first_commit_there_is_no_commit(tmp_path) -> None:
    assert git_commit(tmp_path / "missing") is None
    _git(tmp_path, "init", "-q")
    assert git_commit(tmp_path) is None  # HEAD names no commit yet
