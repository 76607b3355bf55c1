"""Test plugin for multi-process runs: which training objects each process still holds when a
stage's data is delivered (after that process generated its shard of the stage).

Loaded in every process of ``accelerate launch`` through a real ``optima`` entry point (see
``test_data_parallel.py``). At ``optima_generation_end`` it appends to
``$OPTIMA_MEMORY_PROBE_DIR/rank<RANK>.jsonl`` the names of the objects the trainers tracked so
far (:func:`optima_trainers.run.memory.track`: models and trainers of earlier stages, dead or alive)
and those still alive (:func:`optima_trainers.run.memory.live`, after a garbage collection).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from optima_env import hookimpl


@hookimpl
def optima_generation_end(stage: Any, data: Any) -> None:
    folder = os.environ.get("OPTIMA_MEMORY_PROBE_DIR")
    if not folder:
        return
    from optima_trainers.run import memory

    tracked = sorted({name for name, _ in memory._tracked})  # before live() forgets the dead
    record = {"stage": stage.name, "tracked": tracked, "alive": memory.live(), "pid": os.getpid()}
    with open(Path(folder) / f"rank{os.environ.get('RANK', '0')}.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
