"""The memory lifecycle of a run: what one phase held is freed before the next phase starts.

A training phase holds the model, its optimizer, accelerate's wrappers and (LoRA) a merged copy;
the next phase (a vLLM engine, which refuses to start below ``gpu_memory_utilization`` of the
GPU's memory, or the next stage's training) needs that memory back. Each phase drops its
references, asks accelerate to drop its own (``Accelerator.free_memory``), then :func:`release`
collects and empties the CUDA cache.

:func:`track` keeps weak references to a phase's big objects under a name, so that a test (or a
user debugging an out-of-memory error) can ask which of them are still alive (:func:`live`) after
the phase: a weak reference does not keep its object alive, so the check measures the real state.
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

__all__ = ["live", "release", "track"]

_tracked: list[tuple[str, weakref.ref]] = []


def track(name: str, *objects: Any) -> None:
    """Remember weak references to ``objects`` (a phase's model, trainer, engine) under ``name``."""
    for obj in objects:
        if obj is not None:
            _tracked.append((name, weakref.ref(obj)))


def live() -> list[str]:
    """The names of tracked objects still alive after a garbage collection (forgets the dead)."""
    gc.collect()
    _tracked[:] = [(name, ref) for name, ref in _tracked if ref() is not None]
    return [name for name, _ in _tracked]


def release() -> None:
    """Collect garbage and return the CUDA caching allocator's free blocks to the device (when
    torch is already imported and a GPU is there; importing torch here would cost seconds)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
