"""The LoRA export behind ``python -m optima_trainers.cli.export`` (its docstring gives the method
and the output): :func:`export_lora` writes the adapter of a trained model's weight change, which
the command line and the servers' fallback (:mod:`optima_trainers.generation.servers`) both use."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from optima_env.backends.peft_adapter import (
    MANIFEST,
    content_hash,
    file_sha256,
    is_adapter,
    verify_manifest,
)
from optima_env.errors import DataError, TaskContractError
from optima_env.models import source_folder
from optima_trainers.run.checkpoint import is_complete, require_complete
from optima_trainers.run.lora_svd import TOLERANCE, factorize, write_adapter

__all__ = ["DTYPES", "FORMAT", "TOLERANCE", "TRUNCATION_WARNING", "Dtype", "export_lora", "summary"]

logger = logging.getLogger(__name__)

FORMAT = 1
"""Version of ``manifest.json``."""
Dtype = Literal["float16", "bfloat16", "float32"]
DTYPES: tuple[str, ...] = get_args(Dtype)
"""Dtypes of the stored factors."""
TRUNCATION_WARNING = 0.05
"""Mean relative error of the weight change above which an export logs a warning: the rank is
below the change's, and the adapter drops part of what training changed."""
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
_TOKENIZER_FILES += (
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


def export_lora(
    base_model: str,
    trained_model: str | Path,
    out: Path,
    *,
    rank: int = 16,
    dtype: str = "float16",
    provenance: Mapping[str, Any] | None = None,
) -> dict:
    """Write the LoRA adapter of ``trained_model − base_model`` into ``out``; returns its manifest.

    Args:
        base_model: ``embedded``, a hub name or a folder; stored as given in ``adapter_config.json``.
        trained_model: a full model folder of the same architecture (e.g. a trainer checkpoint,
            whose ``COMPLETE`` manifest is verified first).
        out: the adapter folder (replaced atomically; an existing folder must be an export).
        rank: the LoRA rank ``r`` (``lora_alpha = r``).
        dtype: the factors' dtype, one of :data:`DTYPES`.
        provenance: JSON-ready facts stored under ``provenance`` (command, git commit, config, stage).

    Raises:
        TaskContractError: a bad ``rank``, ``dtype`` or ``provenance``.
        DataError: a missing folder, another architecture, no changed linear weight, or changed
            weights a LoRA cannot carry (named in the message).
    """
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise TaskContractError(f"rank must be an int >= 1, got {rank!r}")
    if dtype not in DTYPES:
        raise TaskContractError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    try:
        record = json.loads(json.dumps(dict(provenance or {})))
    except (TypeError, ValueError) as exc:
        raise TaskContractError(
            f"provenance must be JSON-serializable (str, numbers, lists, dicts): {exc}"
        ) from exc
    out = Path(out)
    base = source_folder(base_model)
    trained = source_folder(str(trained_model))
    if is_adapter(trained):
        raise DataError(f"{trained} is already a PEFT adapter folder; expected a full (merged) model folder")
    if is_complete(trained):  # a trainer checkpoint: its files are verified against its manifest
        require_complete(trained)
    base_hash, source_hash = content_hash(base), content_hash(trained)
    wanted = {"base_hash": base_hash, "source_hash": source_hash, "rank": rank, "dtype": dtype}
    existing = _existing_export(out, wanted)
    if existing is not None:
        logger.info("%s already holds this export (same source, base, rank, dtype; files verified)", out)
        return existing
    started = time.perf_counter()
    factors, errors, untouched = factorize(base, trained, rank, dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        parameters = write_adapter(tmp, factors, base_model=base_model, rank=rank)
        tokenizer = "adapter" if _copy_tokenizer_if_changed(base, trained, tmp) else "base"
        files = {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        mean_error = sum(errors) / len(errors)
        if mean_error > TRUNCATION_WARNING:
            logger.warning(
                "%s: the rank-%d adapter carries the weight change with a mean relative error of %.3f "
                "(above %.2f), so it is not the trained model; export at the change's rank (a "
                "LoRA-trained run's is the sum of its stages' ranks) to carry it exactly",
                trained, rank, mean_error, TRUNCATION_WARNING,
            )  # fmt: skip
        manifest = {
            "format": FORMAT,
            "base_model": base_model,
            **wanted,
            "modules": len(factors),
            "parameters": parameters,
            "delta_relative_error": {"mean": mean_error, "max": max(errors)},
            "unchanged_max_relative_difference": untouched,
            "tokenizer": tokenizer,
            "files": files,
            "bytes": sum((tmp / name).stat().st_size for name in files),
            "seconds": round(time.perf_counter() - started, 2),
            "provenance": record,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        _replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("exported %s in %.1f s into %s: %s", trained, manifest["seconds"], out, summary(manifest))
    return manifest


def summary(manifest: Mapping[str, Any]) -> str:
    """One line: the adapter's rank, dtype, modules, size and relative error."""
    error = manifest["delta_relative_error"]
    return (
        f"rank-{manifest['rank']} {manifest['dtype']} LoRA of {manifest['modules']} modules, "
        f"{manifest['bytes'] / 1e6:.2f} MB, relative error mean {error['mean']:.2e} max {error['max']:.2e}"
    )


def _existing_export(out: Path, wanted: Mapping[str, Any]) -> dict | None:
    """The manifest of an equal export already at ``out`` whose files verify, else None."""
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file; expected a folder for the adapter")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise DataError(
            f"{out} exists and is not an adapter export (no {MANIFEST}); choose another --out or remove it"
        )
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    if any(manifest.get(key) != value for key, value in wanted.items()):
        return None
    try:
        verify_manifest(out)
    except DataError as exc:
        logger.warning("%s: %s; exporting again", out, exc)
        return None
    return manifest


def _copy_tokenizer_if_changed(base: Path, trained: Path, out: Path) -> bool:
    """Copy the trained model's tokenizer files when their bytes differ from the base's."""
    names = [n for n in _TOKENIZER_FILES if (base / n).is_file() or (trained / n).is_file()]
    if not any((trained / n).is_file() for n in names):
        return False
    if all(
        (base / n).is_file()
        and (trained / n).is_file()
        and (base / n).read_bytes() == (trained / n).read_bytes()
        for n in names
    ):
        return False
    for name in names:
        if (trained / name).is_file():
            shutil.copyfile(trained / name, out / name)
    return True


def _replace(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is moved aside first and then removed.

    The folder and its files get the modes of the umask (``mkdtemp`` makes a private folder).
    """
    umask = os.umask(0)
    os.umask(umask)
    for path in tmp.iterdir():
        os.chmod(path, 0o666 & ~umask)
    os.chmod(tmp, 0o777 & ~umask)
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
