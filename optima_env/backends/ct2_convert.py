"""Convert a transformers model (or a LoRA checkpoint) into a CTranslate2 model, once per weights.

:func:`convert_model` takes what :func:`optima_env.models.resolve_model_path` takes (``embedded``,
a Hugging Face hub name, a local model folder) and also a PEFT adapter folder (one holding
``adapter_config.json``: the adapter is merged into its base model with ``merge_and_unload`` in
a temporary folder first). The converted model lands in ``<cache>/ct2/<hash>-<compute type>``,
where ``<hash>`` is the sha256 of the source's files (weights, configs and tokenizer files; for
an adapter, the adapter's files and its base model's), so a checkpoint is converted once however
many runs use it, and a changed checkpoint is never served from a stale conversion. The folder is
built with :func:`optima_env.models.build_once` (a temporary folder renamed into place, under a
file lock), holds the tokenizer beside the CTranslate2 files, and is finished by a marker that
records the source, the hash, the compute type and the conversion time (also logged at INFO).

Measured on the project's 2-core machine: SmolLM2-135M converts in 10-14 s (int8 130 MB,
float32 514 MB); hashing its 540 MB of fp32 weights takes about a second.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from optima_env.errors import BackendError, DataError, require
from optima_env.models import COMPLETE_MARKER, build_once, cache_dir, resolve_model_path

__all__ = ["QUANTIZATIONS", "content_hash", "convert_model", "source_folder"]

logger = logging.getLogger(__name__)

QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
)
"""Weight types the converter writes (the policy's ``compute_type``)."""

_SKIPPED = {COMPLETE_MARKER, "COMPLETE", "README.md", "training_args.bin"}
_ADAPTER_CONFIG = "adapter_config.json"
_CHUNK = 1 << 20
_HASHES: dict[tuple[Any, ...], str] = {}
"""Hashes computed in this process, by (base hash, (path, size, mtime) of every hashed file)."""


def source_folder(name_or_path: str) -> Path:
    """The local folder of ``embedded``, a local path, or a hub name (from the HF cache or the hub)."""
    path = resolve_model_path(name_or_path)
    if os.path.isdir(path):
        return Path(path)
    if os.path.exists(path) or path.startswith((".", "/")):
        raise DataError(f"expected a model folder, a hub name or 'embedded', got {name_or_path!r}")
    hub = require("huggingface_hub", "train")
    try:
        return Path(hub.snapshot_download(repo_id=path))
    except Exception as exc:
        raise BackendError(
            f"could not find the model {name_or_path!r} locally or on the hub ({type(exc).__name__}: "
            f"{exc}); pass a local folder, 'embedded', or download it first"
        ) from exc


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

    An adapter folder's hash covers its base model's folder too. Hidden files, completion markers
    and ``README.md`` are left out, so re-saving a folder elsewhere keeps its hash. Within one
    process a folder whose files kept their sizes and modification times is not hashed again.
    """
    folder = Path(folder)
    files = _hashed_files(folder)
    adapter = folder / _ADAPTER_CONFIG
    base = content_hash(_adapter_base(adapter)) if adapter.exists() else ""
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


def _adapter_base(adapter_config: Path) -> Path:
    try:
        base = json.loads(adapter_config.read_text())["base_model_name_or_path"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f"{adapter_config}: expected a PEFT adapter config with 'base_model_name_or_path' ({exc})"
        ) from exc
    if not base:
        raise DataError(f"{adapter_config}: 'base_model_name_or_path' is empty; set it to the base model")
    return source_folder(base)


def convert_model(
    name_or_path: str = "embedded", *, compute_type: str = "int8", root: str | os.PathLike[str] | None = None
) -> Path:
    """The CTranslate2 folder of a model, converting it on the first call for its weights.

    Args:
        name_or_path: ``embedded``, a hub name, a model folder, or a PEFT adapter folder.
        compute_type: the weights' type, one of :data:`QUANTIZATIONS` (``int8`` on CPUs).
        root: cache folder (default ``<optima cache>/ct2``).

    Returns:
        A folder that ``ctranslate2.Generator`` and ``transformers.AutoTokenizer`` both load.
    """
    if compute_type not in QUANTIZATIONS:
        raise BackendError(f"compute_type must be one of {list(QUANTIZATIONS)}, got {compute_type!r}")
    source = source_folder(name_or_path)
    digest = content_hash(source)
    root = Path(root) if root is not None else cache_dir() / "ct2"
    target = root / f"{digest[:24]}-{compute_type}"
    if (target / COMPLETE_MARKER).exists():
        logger.debug("CTranslate2 cache hit for %s: %s", source, target)
        return target
    root.mkdir(parents=True, exist_ok=True)

    def build(tmp: Path) -> str:
        started = time.perf_counter()
        if (source / _ADAPTER_CONFIG).exists():
            with tempfile.TemporaryDirectory(prefix=".merged-", dir=root) as merged:
                _merge_adapter(source, Path(merged))
                _convert(Path(merged), tmp, compute_type)
        else:
            _convert(source, tmp, compute_type)
        seconds = time.perf_counter() - started
        logger.info("converted %s to CTranslate2 %s in %.1f s: %s", source, compute_type, seconds, target)
        record = {"source": str(source), "sha256": digest, "compute_type": compute_type, "seconds": seconds}
        return json.dumps(record) + "\n"

    return build_once(target, build)


def _convert(source: Path, out: Path, quantization: str) -> None:
    converters = require("ctranslate2.converters", "ct2")
    transformers = require("transformers", "train")
    converter = converters.TransformersConverter(str(source), low_cpu_mem_usage=True)
    try:
        converter.convert(str(out), quantization=quantization, force=True)
    except Exception as exc:
        raise BackendError(
            f"CTranslate2 could not convert {source} ({type(exc).__name__}: {exc}); it supports the "
            "architectures listed in its docs (Llama, Mistral, Qwen, Gemma, ...)"
        ) from exc
    transformers.AutoTokenizer.from_pretrained(source).save_pretrained(out)
    if (source / "generation_config.json").exists():  # its end-of-sequence ids
        shutil.copyfile(source / "generation_config.json", out / "generation_config.json")


def _merge_adapter(adapter: Path, out: Path) -> None:
    """Merge a PEFT LoRA adapter into its base model (fp32) and save model and tokenizer to ``out``."""
    torch = require("torch", "train")
    transformers = require("transformers", "train")
    peft = require("peft", "train")
    base_path = _adapter_base(adapter / _ADAPTER_CONFIG)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    merged.save_pretrained(out)
    has_tokenizer = (adapter / "tokenizer_config.json").exists()
    transformers.AutoTokenizer.from_pretrained(adapter if has_tokenizer else base_path).save_pretrained(out)
