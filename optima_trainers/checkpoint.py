"""Checkpoints written atomically, and the result record every training stage returns.

A checkpoint is a plain transformers model folder (LoRA already merged), so the next iteration,
a rollout or ``benchmarks.run`` loads it like any model. It is written into a temporary sibling
folder, a ``COMPLETE`` marker is written last, and the folder is then renamed into place. A
folder without the marker (a run killed while saving) is never loaded: :func:`is_complete`
says no, :func:`discard_partial` removes it, and the stage is trained again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optima_env.errors import DataError

__all__ = [
    "COMPLETE_MARKER",
    "TrainResult",
    "atomic_checkpoint",
    "discard_partial",
    "is_complete",
    "require_complete",
    "train_metrics",
]

COMPLETE_MARKER = "COMPLETE"
"""File written last inside a finished checkpoint folder (JSON: the training summary)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainResult:
    """What one training stage (SFT or DPO) produced."""

    checkpoint: str
    """The saved model folder (LoRA merged into the weights)."""
    train_loss: float | None
    """Mean training loss over the run (``None`` when no step ran)."""
    steps: int
    """Optimizer steps taken."""
    num_examples: int
    """Training examples (SFT) or preference pairs (DPO) the stage saw."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Further scalars (``train_runtime``, eval loss, reward accuracies, ...)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "checkpoint": self.checkpoint,
            "train_loss": self.train_loss,
            "steps": self.steps,
            "num_examples": self.num_examples,
            "metrics": dict(self.metrics),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainResult:
        """Rebuild from :meth:`to_dict` output."""
        try:
            return cls(
                checkpoint=str(data["checkpoint"]),
                train_loss=data["train_loss"],
                steps=int(data["steps"]),
                num_examples=int(data["num_examples"]),
                metrics=dict(data.get("metrics", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"not a training summary: {exc}; got keys {sorted(data)}") from exc


def is_complete(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a checkpoint folder whose ``COMPLETE`` marker was written."""
    return (Path(path) / COMPLETE_MARKER).is_file()


def require_complete(path: str | os.PathLike[str]) -> TrainResult:
    """The summary stored in a complete checkpoint; raises :class:`DataError` otherwise."""
    marker = Path(path) / COMPLETE_MARKER
    if not marker.is_file():
        raise DataError(
            f"{path} is not a complete checkpoint (no {COMPLETE_MARKER} marker): it was interrupted "
            "while being written; delete it (or resume the run, which retrains it)"
        )
    try:
        return TrainResult.from_dict(json.loads(marker.read_text(encoding="utf-8")))
    except json.JSONDecodeError as exc:
        raise DataError(f"{marker}: corrupt marker ({exc}); delete the checkpoint and resume") from exc


def discard_partial(path: str | os.PathLike[str]) -> bool:
    """Remove ``path`` and any temporary siblings if it is not complete; True if something went."""
    path = Path(path)
    removed = False
    if path.exists() and not is_complete(path):
        shutil.rmtree(path)
        removed = True
    if path.parent.is_dir():
        for tmp in path.parent.glob(f".{path.name}.tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)
            removed = True
    return removed


@contextlib.contextmanager
def atomic_checkpoint(path: str | os.PathLike[str]) -> Iterator[tuple[Path, Callable[[TrainResult], None]]]:
    """Write a checkpoint folder atomically.

    Yields ``(tmp_dir, finish)``: save the model into ``tmp_dir``, then call ``finish(result)``,
    which writes the marker (the summary as JSON) and renames the folder to ``path``. If the
    block raises or ``finish`` is never called, nothing appears at ``path``.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_checkpoint(root / "ckpt") as (tmp, finish):
    ...     _ = (tmp / "weights").write_text("w")
    ...     finish(TrainResult(checkpoint=str(root / "ckpt"), train_loss=1.0, steps=1, num_examples=2))
    >>> is_complete(root / "ckpt")
    True
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    discard_partial(path)
    if path.exists():
        raise DataError(f"{path} already holds a complete checkpoint; refusing to overwrite it")
    tmp = path.parent / f".{path.name}.tmp-write"  # a fixed name: every process of a run agrees on it
    tmp.mkdir()
    done = False

    def finish(result: TrainResult) -> None:
        nonlocal done
        marker = tmp / COMPLETE_MARKER
        with open(marker, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(result.to_dict(), indent=2) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        done = True

    try:
        yield tmp, finish
    finally:
        if not done:
            shutil.rmtree(tmp, ignore_errors=True)


def train_metrics(result: TrainResult | None) -> dict[str, float]:
    """A stage's ``train/*`` metrics (``train/skipped`` when there was nothing to train on)."""
    if result is None:
        return {"train/skipped": 1.0, "train/steps": 0.0}
    out = {"train/steps": float(result.steps), "train/num_examples": float(result.num_examples)}
    if result.train_loss is not None:
        out["train/loss"] = float(result.train_loss)
    out.update({f"train/{k}": float(v) for k, v in result.metrics.items() if isinstance(v, (int, float))})
    return out
