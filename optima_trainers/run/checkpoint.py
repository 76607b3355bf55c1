"""Checkpoints written atomically, and the result record every training stage returns.

A checkpoint is a plain transformers model folder (LoRA already merged), so the next iteration,
a rollout or ``benchmarks.run`` loads it like any model. It is written into a temporary sibling
folder, a ``COMPLETE`` marker is written last, and the folder is then renamed into place.

The marker is a small JSON manifest: the training summary (the :class:`TrainResult` fields) and
``files``, the relative path, size and sha256 of every other file of the folder (each fsync'ed
while it is hashed). Two kinds of damage are told apart:

* **partial** (no marker: a run killed while saving): :func:`is_complete` says no,
  :func:`discard_partial` removes it, and a resumed run trains the stage again;
* **corrupt** (a marker whose manifest no longer matches the files, e.g. weights truncated by a
  full disk or altered after the checkpoint was finished; never produced by a crash of the
  writer): :func:`require_complete`, which the trainer calls before it loads any checkpoint,
  raises :class:`CorruptCheckpointError` naming the file. The run stops loudly instead of
  deleting anything: the message says to delete the folder and resume, which retrains it.

A marker without its manifest or training history is of run folder format 1
(:mod:`optima_trainers.run.run_format`) and is refused with that one line.
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

from optima_env.backends.peft_adapter import file_sha256
from optima_env.errors import CorruptCheckpointError, DataError
from optima_trainers.run.run_format import old_format_error

__all__ = [
    "COMPLETE_MARKER",
    "CorruptCheckpointError",
    "TrainResult",
    "atomic_checkpoint",
    "discard_partial",
    "is_complete",
    "manifest_entries",
    "require_complete",
    "train_metrics",
]

COMPLETE_MARKER = "COMPLETE"
"""File written last inside a finished checkpoint folder (JSON: the training summary and the
``files`` manifest: relative path -> ``{"size": bytes, "sha256": hex}``)."""


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
    history: tuple[Mapping[str, float], ...] = ()
    """The trainer's whole log history, one record of scalars per logged step or evaluation (each
    with ``step`` and ``epoch``); empty for a trainer that keeps none."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "checkpoint": self.checkpoint,
            "train_loss": self.train_loss,
            "steps": self.steps,
            "num_examples": self.num_examples,
            "metrics": dict(self.metrics),
            "history": [dict(h) for h in self.history],
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
                history=tuple(dict(h) for h in data["history"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"not a training summary: {exc}; got keys {sorted(data)}") from exc


def is_complete(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a checkpoint folder whose ``COMPLETE`` marker was written.

    A cheap check (the writer finished); it does not read the files. :func:`require_complete`
    verifies them against the manifest, and is what callers use before loading the checkpoint.
    """
    return (Path(path) / COMPLETE_MARKER).is_file()


def require_complete(path: str | os.PathLike[str], *, verify: bool = True) -> TrainResult:
    """The summary stored in a complete checkpoint, after verifying its files against the manifest
    (``verify=False``: the marker only, for the writer that has just hashed the files itself).

    Raises:
        DataError: ``path`` has no ``COMPLETE`` marker (interrupted while being written), or its
            marker is of run folder format 1 (no manifest or no history).
        CorruptCheckpointError: the marker is unreadable, or a file it lists is missing or has
            another size or sha256 than when the checkpoint was finished. The message names the
            file and says what to do (delete the folder, then resume to retrain it).
    """
    path = Path(path)
    marker = path / COMPLETE_MARKER
    if not marker.is_file():
        raise DataError(
            f"{path} is not a complete checkpoint (no {COMPLETE_MARKER} marker): it was interrupted "
            "while being written; delete it (or resume the run, which retrains it)"
        )
    fix = f"delete the folder {path} and resume the run (--resume), which trains that stage again"
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(f"{marker}: corrupt marker ({exc}); {fix}") from exc
    if not isinstance(data, dict):
        raise CorruptCheckpointError(f"{marker}: expected a JSON object, got {type(data).__name__}; {fix}")
    _check_format(marker, data)
    if verify:
        _verify_files(path, marker, data["files"], fix)
    try:
        return TrainResult.from_dict(data)
    except DataError as exc:
        raise CorruptCheckpointError(f"{marker}: {exc}; {fix}") from exc


def manifest_entries(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The ``files`` manifest of a complete checkpoint (relative path -> ``{"size", "sha256"}``);
    empty for a folder without a marker.

    Raises:
        CorruptCheckpointError: the marker is unreadable, or its ``files`` is not an object.
        DataError: the marker is of run folder format 1 (no manifest or no history).
    """
    marker = Path(path) / COMPLETE_MARKER
    if not marker.is_file():
        return {}
    fix = f"delete the folder {path} and resume the run (--resume), which trains that stage again"
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(f"{marker}: corrupt marker ({exc}); {fix}") from exc
    if isinstance(data, dict):
        _check_format(marker, data)
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        raise CorruptCheckpointError(f"{marker}: field 'files': expected an object, got {files!r:.80}; {fix}")
    return files


def _check_format(marker: Path, data: dict[str, Any]) -> None:
    """Refuse a marker of run folder format 1: no ``files`` manifest, or a summary without ``history``."""
    if "files" not in data:
        raise old_format_error(marker, "no 'files' manifest")
    if "checkpoint" in data and "history" not in data:
        raise old_format_error(marker, "no training 'history'")


def _verify_files(path: Path, marker: Path, files: Any, fix: str) -> None:
    if not isinstance(files, dict):
        raise CorruptCheckpointError(f"{marker}: field 'files': expected an object, got {files!r:.80}; {fix}")
    for name, entry in sorted(files.items()):
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int):
            raise CorruptCheckpointError(
                f"{marker}: field 'files.{name}': expected {{'size': int, 'sha256': str}}, "
                f"got {entry!r:.80}; {fix}"
            )
        target = path / name
        if not target.is_file():
            raise CorruptCheckpointError(f"{target}: listed in {marker} but missing; {fix}")
        size = target.stat().st_size
        if size != entry["size"]:
            raise CorruptCheckpointError(
                f"{target}: {size} bytes, but {entry['size']} when the checkpoint was finished "
                f"(truncated or altered); {fix}"
            )
        if file_sha256(target) != entry.get("sha256"):
            raise CorruptCheckpointError(
                f"{target}: sha256 differs from the one recorded in {marker} (altered after the "
                f"checkpoint was finished); {fix}"
            )


def _manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file under ``folder`` but the marker (each fsync'ed)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER)
    return {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p, sync=True)}
        for p in files
    }


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    which writes the marker (the summary and the manifest of every file, as JSON) and renames the
    folder to ``path``. If the block raises or ``finish`` is never called, nothing appears at
    ``path``.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_checkpoint(root / "ckpt") as (tmp, finish):
    ...     _ = (tmp / "weights").write_text("w")
    ...     finish(TrainResult(checkpoint=str(root / "ckpt"), train_loss=1.0, steps=1, num_examples=2))
    >>> is_complete(root / "ckpt"), require_complete(root / "ckpt").steps
    (True, 1)
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
        record = {**result.to_dict(), "files": _manifest(tmp)}
        with open(marker, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(record, indent=2) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        _fsync_dir(tmp)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
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
