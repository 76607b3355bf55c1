"""Checks of the paths a user passes on a command line, and the one-writer lock of an output folder.

Every CLI (``optima_trainers.train``, ``benchmarks.run``, ``optima_trainers.cli.export``) checks its
path-taking flags with these before it loads a model or creates a folder, so a typo is one line
(what was expected, what was got, what to do) and leaves nothing behind.

:func:`folder_lock` is an ``fcntl.flock`` on ``<folder>/.lock`` (the kernel releases it when its
holder dies, so a stale lock of a dead process is simply taken over) whose file holds the holder's
pid, for the refusal message; the holder removes the file as it lets go, so a finished folder
has no ``.lock`` (one a killed process left is taken over). We use ``flock`` rather than a
third-party lock package: it is the standard library's, works on every POSIX system this project
supports, and cannot go stale.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from optima_env.errors import DataError, TaskContractError

__all__ = ["LOCK_NAME", "check_input_folder", "check_model_flag", "check_output_folder", "folder_lock"]

LOCK_NAME = ".lock"
MODEL_MARKERS = ("config.json", "adapter_config.json")
"""A model folder holds one of these: transformers' ``save_pretrained`` output or a PEFT
adapter."""
TOKENIZER_FILES = frozenset({"tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json"})
"""A full model folder holds one of these (the CLIs load the tokenizer from the model's folder)."""


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _looks_local(value: str) -> bool:
    return value.startswith((".", "/", "~")) or value.count("/") > 1 or "\\" in value


def check_model_flag(
    flag: str, value: str, *, names: tuple[str, ...] = ("embedded",), require_cached: bool = True
) -> bool:
    """Refuse a model flag's value that cannot load, before anything is loaded or created.

    Accepted: one of ``names`` (``embedded``, ...), a folder holding a model (``config.json``) or a
    PEFT adapter (``adapter_config.json``), or a Hugging Face hub name (offline: only one in the
    local Hugging Face cache, unless ``require_cached`` is false: a command that loads no model,
    such as the trainer's ``--print-config``). Raises :class:`TaskContractError` naming the flag
    otherwise. Returns whether the value was checked in full: ``False`` only for a hub name that,
    offline, is not in the cache and was let through because ``require_cached`` is false.
    """
    if value in names:
        return True
    choices = [f"a model folder (with {' or '.join(MODEL_MARKERS)})", "a Hugging Face name"]
    accepted = ", ".join(choices + [repr(n) for n in names])
    path = Path(value).expanduser()
    if path.is_dir():
        if not any((path / marker).is_file() for marker in MODEL_MARKERS):
            raise TaskContractError(
                f"{flag} {value!r} is a folder but not a model (no {' or '.join(MODEL_MARKERS)} in it); "
                f"expected {accepted}; pass the folder a model was saved to (save_pretrained)"
            )
        missing = _missing_model_files(path)
        if missing:
            raise TaskContractError(
                f"{flag} {value!r} is not a complete model folder: it has no {missing}; pass a folder "
                "that save_pretrained wrote with its tokenizer (model.save_pretrained(folder) and "
                "tokenizer.save_pretrained(folder))"
            )
        return True
    if path.exists():
        raise TaskContractError(f"{flag} {value!r} is a file; expected {accepted}")
    if _looks_local(value):
        raise TaskContractError(f"{flag} {value!r} does not exist; expected {accepted}; check the path")
    if _offline() and not _in_hub_cache(value):
        if not require_cached:
            return False
        raise TaskContractError(
            f"{flag} {value!r} is neither a local folder nor a model in the Hugging Face cache, and the "
            f"hub is offline (HF_HUB_OFFLINE=1); expected {accepted}; pass a local folder"
            + "".join(f" or {n!r}" for n in names)
        )
    return True


def _missing_model_files(path: Path) -> str:
    """What a model folder lacks to load: weights, or (a full model) a tokenizer; ``""`` if none."""
    names = {p.name for p in path.iterdir()}
    if "adapter_config.json" in names:
        weights = any(n.startswith("adapter_model.") for n in names)
        return "" if weights else "adapter weights (adapter_model.safetensors or .bin)"
    if not any(
        n.endswith((".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")) for n in names
    ):
        return "weights (*.safetensors or *.bin)"
    if not names & TOKENIZER_FILES:
        return f"tokenizer ({' / '.join(sorted(TOKENIZER_FILES))})"
    return ""


def _in_hub_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # no hub client: nothing could be loaded from the hub either
        return False
    try:
        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # an invalid repo id: not a cached model
        return False
    return isinstance(found, str)


def check_output_folder(flag: str, value: str | os.PathLike[str]) -> Path:
    """``value`` as the folder a run writes to: refused when it is a file, or when no folder can
    be created there (the nearest existing parent is a file or not writable)."""
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise TaskContractError(
            f"{flag} {str(value)!r} is a file; expected a folder to write into; pass another path"
        )
    parent = path if path.exists() else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise TaskContractError(
            f"{flag} {str(value)!r}: cannot write there ({parent} is not a writable folder); "
            "pass a path in a folder you can write to"
        )
    return path


def check_input_folder(flag: str, value: str | os.PathLike[str]) -> Path:
    """``value`` as an existing folder to read (``--data-dir``)."""
    path = Path(value).expanduser()
    if not path.is_dir():
        got = "a file" if path.exists() else "no such folder"
        raise DataError(f"{flag} {str(value)!r}: expected an existing folder, got {got}; check the path")
    return path


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike[str], *, what: str) -> Iterator[None]:
    """Hold ``folder``'s one-writer lock; a second holder gets :class:`TaskContractError` at once
    naming the holder's pid. ``what`` names the folder in the message (``--out``, ``the run``).
    The lock file is removed when the holder lets go, so a finished folder holds none."""
    path = Path(folder) / LOCK_NAME
    handle = _locked(path, folder, what)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        if _same_file(handle, path):  # still ours: unlinked while held, so no one locks a removed file
            path.unlink()
        handle.close()


def _locked(path: Path, folder: str | os.PathLike[str], what: str) -> Any:
    """``path`` opened and flocked. A holder removes the file before it lets go, so a file
    locked after its removal is not the lock any more: open the path again."""
    while True:
        handle = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise TaskContractError(
                f"{what} {folder} is in use by another process (pid {holder}); wait for it to finish or "
                "stop it, or use another folder"
            ) from None
        if _same_file(handle, path):
            return handle
        handle.close()


def _same_file(handle: Any, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False
