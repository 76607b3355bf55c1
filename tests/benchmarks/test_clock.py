"""The invocation clock: each invocation's wall time survives a SIGKILL (at most one interval lost)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.clock import InvocationClock, total_seconds

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_finished_invocation_is_recorded_and_invocations_add_up(tmp_path: Path) -> None:
    path = tmp_path / "invocations.json"
    for _ in range(2):
        with InvocationClock(path, interval_s=0.05):
            time.sleep(0.3)
    seconds, count = total_seconds(path)
    assert count == 2 and seconds >= 0.6  # what was slept, summed over the two invocations
    entries = json.loads(path.read_text(encoding="utf-8"))["invocations"]
    assert len({e["id"] for e in entries}) == 2 and all(e["seconds"] >= 0.3 for e in entries)


def test_a_killed_invocation_keeps_all_but_the_last_interval(tmp_path: Path) -> None:
    path = tmp_path / "invocations.json"
    script = (
        "import time; from pathlib import Path; from benchmarks.clock import InvocationClock\n"
        f"with InvocationClock(Path({str(path)!r}), interval_s=0.1):\n    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 30
        while total_seconds(path)[0] < 1.0 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    seconds, count = total_seconds(path)
    assert count == 1 and seconds >= 1.0  # written while running, not only on a clean exit


def test_a_missing_or_torn_file_counts_nothing(tmp_path: Path) -> None:
    assert total_seconds(tmp_path / "none.json") == (0.0, 0)
    (tmp_path / "torn.json").write_text('{"invocations": [{"seconds": 3', encoding="utf-8")
    assert total_seconds(tmp_path / "torn.json") == (0.0, 0)
