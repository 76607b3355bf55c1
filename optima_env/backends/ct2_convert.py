"""Convert a transformers model (or a LoRA checkpoint) into a CTranslate2 model, once per weights.

:func:`convert_model` takes what :func:`optima_env.models.resolve_model_path` takes (``embedded``,
a Hugging Face hub name, a local model folder) and also a PEFT adapter folder (one holding
``adapter_config.json``: the adapter is merged into its base model with ``merge_and_unload`` in
a temporary folder first, by :func:`optima_env.backends.peft_adapter.merge_into`). The converted
model lands in ``<cache>/ct2/<hash>-<compute type>``, where ``<hash>`` is the sha256 of the
source's files (weights, configs and tokenizer files; for an adapter, the adapter's files and its
base model's: :func:`~optima_env.backends.peft_adapter.content_hash`), so a checkpoint is
converted once however many runs use it, and a changed checkpoint is never served from a stale
conversion. The folder is built with :func:`optima_env.models.build_once` (a temporary folder
renamed into place, under a file lock), holds the tokenizer beside the CTranslate2 files, and is
finished by a marker that records the source, the hash, the compute type and the conversion time
(also logged at INFO).

Measured on the project's 2-core machine: SmolLM2-135M converts in 10-14 s (int8 130 MB,
float32 514 MB); hashing its 540 MB of fp32 weights takes about a second.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from optima_env.backends.peft_adapter import content_hash, is_adapter, merge_into
from optima_env.errors import BackendError, require
from optima_env.models import COMPLETE_MARKER, build_once, cache_dir, source_folder

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
        if is_adapter(source):
            with tempfile.TemporaryDirectory(prefix=".merged-", dir=root) as merged:
                merge_into(source, merged)
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
