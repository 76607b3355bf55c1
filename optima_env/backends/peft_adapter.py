"""PEFT LoRA adapter folders: recognise, verify, merge and load them (the one place for adapters).

An adapter folder holds ``adapter_config.json``, whose ``base_model_name_or_path`` names its base
model (``embedded``, a hub name or a folder, resolved by :func:`optima_env.models.source_folder`,
so ``embedded`` works offline), and ``adapter_model.safetensors``. One written by
:func:`optima_trainers.run.export.export_lora` also holds ``manifest.json`` (``files``: the sha256 of
every other file, checked by :func:`verify_manifest` before the adapter is loaded) and, only when
training changed it, the tokenizer; otherwise the base model's tokenizer is used.

* the transformers backend (:meth:`optima_env.backends.hf.TransformersPolicy.from_pretrained`)
  loads an adapter merged into its base with ``merge_and_unload`` (:func:`load_merged`);
* :func:`merge_into` saves the merged model and its tokenizer into a folder (for engines that load
  full model folders only, such as vLLM);
* :func:`content_hash` names a model folder by its files; an adapter's hash covers its base's.

torch, transformers and peft are imported inside the functions that use them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from optima_env.errors import DataError, require
from optima_env.models import COMPLETE_MARKER, load_model, load_tokenizer, source_folder

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "MANIFEST",
    "adapter_base",
    "content_hash",
    "file_sha256",
    "is_adapter",
    "load_merged",
    "merge_into",
    "verify_manifest",
]

ADAPTER_CONFIG = "adapter_config.json"
"""PEFT's adapter configuration file; its presence makes a folder an adapter folder."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""PEFT's adapter weights file."""
MANIFEST = "manifest.json"
"""The export record of an adapter folder: its provenance and ``files`` (name -> sha256)."""

_SKIPPED = {COMPLETE_MARKER, "COMPLETE", MANIFEST, "README.md", "training_args.bin"}
_CHUNK = 1 << 20
_HASHES: dict[tuple[Any, ...], str] = {}
"""Hashes computed in this process, by (base hash, (path, size, mtime) of every hashed file)."""


def is_adapter(folder: str | os.PathLike[str]) -> bool:
    """True when ``folder`` is a local folder holding ``adapter_config.json``.

    >>> is_adapter("embedded")
    False
    """
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(folder: str | os.PathLike[str]) -> Path:
    """The local folder of an adapter's base model (``base_model_name_or_path``, resolved)."""
    config = Path(folder) / ADAPTER_CONFIG
    try:
        base = json.loads(config.read_text(encoding="utf-8"))["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f"{config}: expected a PEFT adapter config with 'base_model_name_or_path' "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if not base or not isinstance(base, str):
        raise DataError(
            f"{config}: 'base_model_name_or_path' is {base!r}; set it to the base model "
            "('embedded', a hub name or a folder)"
        )
    return source_folder(base)


def file_sha256(path: str | os.PathLike[str], *, sync: bool = False) -> str:
    """The sha256 (hex) of one file's bytes (``sync``: and fsync the file while it is open, as a
    checkpoint's manifest does for each file it lists)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
        if sync:
            os.fsync(handle.fileno())
    return digest.hexdigest()


def verify_manifest(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Check every file that ``manifest.json`` lists against its sha256; the manifest, or None.

    A folder without a manifest is not checked (``None``).

    Raises:
        DataError: the manifest is malformed, or a listed file is missing or has another sha256
            (the message names the file, the expected and the actual hash, and what to do).
    """
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        return None
    fix = (
        f"restore the folder (e.g. `git checkout -- {folder}`) or export the adapter again with "
        "`python -m optima_trainers.cli.export`"
    )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: expected JSON, got unreadable text ({exc}); {fix}") from exc
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise DataError(
            f"{path}: expected an object with 'files': {{name: sha256}}, got {manifest!r:.120}; {fix}"
        )
    for name, expected in sorted(files.items()):
        target = folder / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise DataError(f"{path}: expected file names inside the folder, got {name!r}; {fix}")
        if not target.is_file():
            raise DataError(f"{target}: listed in {path} but missing; {fix}")
        got = file_sha256(target)
        if got != expected:
            raise DataError(
                f"{target}: expected sha256 {expected} (as {path} lists), got {got}: the file was "
                f"altered or damaged after export; {fix}"
            )
    return manifest


def load_merged(
    folder: str | os.PathLike[str], *, dtype: str = "float32", device: str | None = None
) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the adapter merged into its base (``merge_and_unload``), eval mode.

    The manifest is verified first (:func:`verify_manifest`). The tokenizer is the adapter
    folder's when it has one, else the base model's (both padding on the left).

    Args:
        folder: the adapter folder.
        dtype: the model's dtype (``float32``, ``bfloat16``, ...), as :func:`optima_env.models.load_model`.
        device: ``cpu``, ``cuda``, ... (default: CUDA when available, else CPU).
    """
    folder = Path(folder)
    verify_manifest(folder)
    peft = require("peft", "train")
    base = adapter_base(folder)
    model, tokenizer = load_model(str(base), dtype=dtype, device=device)
    try:
        merged = peft.PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    except Exception as exc:  # shapes, module names or a damaged file: PEFT raises various types
        raise DataError(
            f"{folder}: PEFT could not load this adapter onto its base {base} ({type(exc).__name__}: "
            f"{exc}); is it an adapter of that model? Export it again against the right --base"
        ) from exc
    merged.eval()
    if (folder / "tokenizer_config.json").is_file():
        tokenizer = load_tokenizer(folder)
    return merged, tokenizer


def merge_into(folder: str | os.PathLike[str], out: str | os.PathLike[str]) -> None:
    """Save the adapter merged into its base (fp32, on the CPU) and its tokenizer into ``out``."""
    model, tokenizer = load_merged(folder, dtype="float32", device="cpu")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _hashed_files(folder: Path) -> list[Path]:
    files = [
        p
        for p in sorted(folder.iterdir())
        if p.is_file()
        and not p.name.startswith(".")
        and p.name not in _SKIPPED
        and not p.name.endswith(".lock")
    ]
    if not any(p.suffix in (".safetensors", ".bin", ".pt", ".pth") for p in files):
        raise DataError(f"{folder} holds no weight files (*.safetensors, *.bin); is it a model folder?")
    return files


def content_hash(folder: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of a model folder's top-level files, names included, in name order.

    An adapter folder's hash covers its base model's folder too. Hidden files, completion markers,
    ``manifest.json`` and ``README.md`` are left out, so re-saving a folder elsewhere keeps its
    hash. Within one process a folder whose files kept their sizes and modification times is not
    hashed again.
    """
    folder = Path(folder)
    files = _hashed_files(folder)
    base = content_hash(adapter_base(folder)) if is_adapter(folder) else ""
    stamp = (base, *((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if stamp in _HASHES:  # unchanged since this process hashed it
        return _HASHES[stamp]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        digest.update(b"\0")
    if base:
        digest.update(b"base:" + base.encode())
    _HASHES[stamp] = digest.hexdigest()
    return _HASHES[stamp]
