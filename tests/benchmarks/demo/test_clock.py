"""The invocation clock: each invocation's wall time survives a SIGKILL (at most one interval lost)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.demo.clock import InvocationClock, total_seconds
from optima_env.errors import DataError
from tests.helpers import REPO_ROOT


def test_a_finished_invocation_is_recorded_and_invocations_add_up(tmp_path: Path) -> None:
    path = tmp_path / "invocations.json"
    for _ in range(2):
        with InvocationClock(path, interval_s=0.05):
            time.sleep(0.3)
    seconds, count, since = total_seconds(path)
    assert count == 2 and seconds >= 0.6  # what was slept, summed over the two invocations
    entries = json.loads(path.read_text(encoding="utf-8"))["invocations"]
    assert len({e["id"] for e in entries}) == 2 and all(e["seconds"] >= 0.3 for e in entries)
    assert since == entries[0]["started"]


def test_a_killed_invocation_keeps_all_but_the_last_interval(tmp_path: Path) -> None:
    path = tmp_path / "invocations.json"
    script = (
        "import time; from pathlib import Path; from benchmarks.demo.clock import InvocationClock\n"
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
    seconds, count, _ = total_seconds(path)
    assert count == 1 and seconds >= 1.0  # written while running, not only on a clean exit


def test_a_missing_file_counts_nothing(tmp_path: Path) -> None:
    assert total_seconds(tmp_path / "none.json") == (0.0, 0, None)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"invocations": [{"seconds": 3', "truncated"),
        ('{"invocations": {"seconds": 3}}', 'under "invocations"'),
        ('{"invocations": [{"seconds": "3"}]}', 'under "invocations"'),
    ],
)
def test_a_corrupt_file_is_an_error_not_zero_seconds(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "invocations.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match="delete it to restart the count") as err:
        total_seconds(path)
    assert str(path) in str(err.value) and says in str(err.value)
    with pytest.raises(DataError), InvocationClock(path):  # a run does not start over it either
        pass
