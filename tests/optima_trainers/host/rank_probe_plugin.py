"""Test plugin for multi-process runs: what each process received, and what it wrote.

Installed into a test's subprocesses through a real ``optima`` entry point (a ``.dist-info`` on
``PYTHONPATH``, see ``test_multiprocess.py``), so every process of ``accelerate launch`` loads it
with the other plugins. It appends JSON lines to ``$OPTIMA_PROBE_DIR/rank<RANK>.jsonl``:

* ``{"event": "delivered", ...}`` from ``optima_generation_end``: the stage, the process's rank and
  world size, the number of episodes, selected episodes and pairs, and a sha256 of the selected
  episodes and pairs (what the backend trains on);
* ``{"event": "write", ...}`` from a ``sys.addaudithook`` hook: every file opened for writing,
  folder created, renamed or removed under ``$OPTIMA_PROBE_WATCH`` (the run folder) by this process.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from optima_env import hookimpl

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_busy = False


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _record(entry: dict[str, Any]) -> None:
    global _busy
    _busy = True
    try:
        out = Path(os.environ["OPTIMA_PROBE_DIR"]) / f"rank{_rank()}.jsonl"
        with open(out, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({**entry, "rank": _rank(), "pid": os.getpid()}) + "\n")
    finally:
        _busy = False


def _path(value: Any) -> str | None:
    if isinstance(value, (str, bytes, os.PathLike)):
        return os.path.abspath(os.fsdecode(value))
    return None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _busy or event not in ("open", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree"):
        return
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS
        )
        if not writing:
            return
        paths = [_path(path)]
    else:
        paths = [_path(a) for a in args[:2] if _path(a)] if event == "os.rename" else [_path(args[0])]
    watch = os.environ.get("OPTIMA_PROBE_WATCH")
    touched = [p for p in paths if p and watch and p.startswith(os.path.abspath(watch))]
    if touched:
        _record({"event": "write", "op": event, "paths": touched})


if os.environ.get("OPTIMA_PROBE_DIR"):
    sys.addaudithook(_audit)


@hookimpl
def optima_generation_end(stage: Any, data: Any) -> None:
    if not os.environ.get("OPTIMA_PROBE_DIR"):
        return
    payload = {"selected": [e.to_dict() for e in data.selected], "pairs": [p.to_dict() for p in data.pairs]}
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()
    _record(
        {
            "event": "delivered",
            "stage": stage.name,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "episodes": len(data.episodes),
            "selected": len(data.selected),
            "pairs": len(data.pairs),
            "sha256": digest,
        }
    )
