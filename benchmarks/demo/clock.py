"""The wall time of every invocation of a long run, kept across crashes (``invocations.json``).

A resumed run's phase timings count only the phases that finished; the time of a phase cut short
by a kill (a session ending mid-stage) would be lost. :class:`InvocationClock` records, in the
run's folder, each invocation's start and how long it has been running, rewritten atomically every
``interval_s`` by a daemon thread and once more on exit, so a SIGKILLed invocation loses at most
``interval_s`` of its time, and the sum over invocations is the wall time the whole run took.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

from optima_env.errors import DataError
from optima_env.io import read_json_object, write_json_atomic

__all__ = ["InvocationClock", "total_seconds"]


_FIX = "repair it, or delete it to restart the count (the run's total then misses the earlier invocations)"


def _read(path: Path) -> list[dict[str, Any]]:
    """The recorded invocations; none for a missing file, :class:`DataError` for a corrupt one."""
    if not path.exists():
        return []
    invocations = read_json_object(path, fix=_FIX).get("invocations")
    if not isinstance(invocations, list) or not all(
        isinstance(i, dict) and isinstance(i.get("seconds"), (int, float)) for i in invocations
    ):
        raise DataError(
            f'{path}: expected {{"invocations": [{{"id": ..., "seconds": N}}, ...]}}, '
            f'got {str(invocations)[:80]!r} under "invocations"; {_FIX}'
        )
    return invocations


def total_seconds(path: Path) -> tuple[float, int, str | None]:
    """The seconds summed over the invocations recorded in ``path``, how many there were, and when
    the first of them started (the count covers only what followed; None when there are none)."""
    invocations = _read(path)
    seconds = round(sum(float(i.get("seconds", 0.0)) for i in invocations), 1)
    return seconds, len(invocations), str(invocations[0].get("started")) if invocations else None


class InvocationClock:
    """Context manager: record this invocation's wall time in ``path`` while it runs."""

    path: Path
    """The ``invocations.json`` file."""
    interval_s: float
    """Seconds between two writes (the most a kill can lose)."""

    def __init__(self, path: Path, *, interval_s: float = 30.0) -> None:
        self.path, self.interval_s = path, interval_s
        self._start = 0.0
        self._entry: dict[str, Any] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        with self._lock:
            self._entry["seconds"] = round(time.perf_counter() - self._start, 1)
            others = [i for i in _read(self.path) if i.get("id") != self._entry["id"]]
            write_json_atomic(self.path, {"invocations": [*others, dict(self._entry)]})

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write()

    def __enter__(self) -> InvocationClock:
        self._start = time.perf_counter()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self._entry = {"id": uuid.uuid4().hex, "started": stamp, "seconds": 0.0}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread = threading.Thread(target=self._beat, name="invocation-clock", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._write()
