"""Test plugin for multi-process runs: which training objects each process still holds when a
stage's data is delivered (after that process generated its shard of the stage), which process
scored each episode, and what was alive whenever a vLLM engine started or woke.

Loaded in every process of ``accelerate launch`` through a real ``optima`` entry point (see
``test_data_parallel.py``). With ``$OPTIMA_MEMORY_PROBE_DIR`` set it appends JSON lines:

* to ``rank<RANK>.jsonl``, at ``optima_generation_end``: the names of the objects the trainers
  tracked so far (:func:`optima_trainers.run.memory.track`: models and trainers of earlier
  stages, dead or alive) and those still alive (:func:`optima_trainers.run.memory.live`, after a
  garbage collection);
* to ``scored_rank<RANK>.jsonl``, at ``optima_episode_scored``: the stage and the job
  (``metadata["job"]``) of each episode this process scored;
* to ``engine_rank<RANK>.jsonl``: ``{"event": "start"}`` when this process starts a vLLM engine
  (:meth:`~optima_env.backends.vllm.VLLMPolicy.from_pretrained`) and ``{"event": "wake", "alive":
  [...]}`` when its engine wakes (:meth:`~optima_env.backends.vllm.VLLMPolicy.wake_up`), with the
  tracked objects alive then (the readability scorer must not be among them). The two methods are
  wrapped, not replaced: the real engine starts and wakes.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

from optima_env import hookimpl


def _append(name: str, record: dict[str, Any]) -> None:
    path = Path(os.environ["OPTIMA_MEMORY_PROBE_DIR"]) / f"{name}{os.environ.get('RANK', '0')}.jsonl"
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({**record, "pid": os.getpid()}) + "\n")


def _alive() -> list[str]:
    """The tracked objects alive now (without forgetting the dead, as ``memory.live`` would)."""
    from optima_trainers.run import memory

    gc.collect()
    return sorted({name for name, ref in memory._tracked if ref() is not None})


def _watch_engines() -> None:
    from optima_env.backends.vllm import VLLMPolicy

    start, wake_up = VLLMPolicy.from_pretrained.__func__, VLLMPolicy.wake_up

    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        _append("engine_rank", {"event": "start", "alive": _alive()})
        return start(cls, *args, **kwargs)

    def woken(self, *args: Any) -> None:
        _append("engine_rank", {"event": "wake", "alive": _alive()})
        return wake_up(self, *args)

    VLLMPolicy.from_pretrained = classmethod(from_pretrained)
    VLLMPolicy.wake_up = woken


if os.environ.get("OPTIMA_MEMORY_PROBE_DIR"):
    _watch_engines()


@hookimpl
def optima_generation_end(stage: Any, data: Any) -> None:
    if not os.environ.get("OPTIMA_MEMORY_PROBE_DIR"):
        return
    from optima_trainers.run import memory

    tracked = sorted({name for name, _ in memory._tracked})  # before live() forgets the dead
    _append("rank", {"stage": stage.name, "tracked": tracked, "alive": memory.live()})


@hookimpl
def optima_episode_scored(episode: Any, stage: Any) -> None:
    if os.environ.get("OPTIMA_MEMORY_PROBE_DIR"):
        _append("scored_rank", {"stage": stage.name, "job": episode.metadata.get("job")})
