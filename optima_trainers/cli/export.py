"""Export a trained model as a small LoRA adapter: ``python -m optima_trainers.cli.export``.

The trainers save every iteration as a full merged model folder (LoRA r=16 on all linear layers,
merged each iteration; iterations chain, so a final model is the base plus several low-rank
deltas). :func:`export_lora` turns such a folder back into one PEFT LoRA adapter of a few MB that
can be committed and loaded on a fresh clone (``benchmarks.run --model adapters/NAME``)::

    python -m optima_trainers.cli.export --base embedded --model runs/RUN/iter_02/checkpoint \\
        --out adapters/isft-synth [--rank 16] [--dtype float16]

**Method.** For every ``nn.Linear`` weight that training changed, ``Δ = W_trained − W_base`` and
its truncated SVD ``Δ ≈ U_r diag(S_r) V_rᵀ``, which is the best rank-r approximation in the
Frobenius norm (Eckart & Young, "The approximation of one matrix by another of lower rank",
Psychometrika 1, 1936). The factors are split evenly, ``B = U_r·√S_r`` (out × r, PEFT's
``lora_B``) and ``A = √S_r·V_rᵀ`` (r × in, ``lora_A``), with ``lora_alpha = r`` so PEFT's scaling
``alpha / r`` is 1 and ``B @ A ≈ Δ`` (LoRA: Hu et al., arXiv:2106.09685). A delta of rank ≤ r is
carried exactly (up to ``dtype``); the manifest records the relative error
``‖Δ − BA‖_F / ‖Δ‖_F`` of the stored (cast) factors, mean and max over the modules. Weights a LoRA
cannot carry (embeddings, norms, biases) must be unchanged (relative difference ≤ :data:`TOLERANCE`),
or the export fails naming them; a tied ``lm_head`` follows its embedding and is left out.

**Why hand-written.** PEFT creates, trains, merges and unloads adapters, but has no way to
extract one from a weight difference; mergekit's ``mergekit-extract-lora`` does this SVD but comes
with a whole model-merging toolkit. The SVD is a few lines of torch.

**Output** (written into a temporary sibling folder, then renamed into place): a standard PEFT
folder (``adapter_config.json`` with ``base_model_name_or_path`` = the base as given, e.g.
``embedded``; ``adapter_model.safetensors`` in ``dtype``), the trained tokenizer only if its files
differ from the base's, and ``manifest.json`` (format 1: base and source content hashes, rank,
dtype, error, ``files`` name -> sha256, ``bytes``, ``provenance``). A rerun for the same source,
base, rank and dtype whose files still verify returns the manifest without recomputing. A
checkpoint saved in bfloat16 is compared with the base rounded to bfloat16 (rounding is no change).
Measured on 2 CPU cores: SmolLM2-135M's shapes (210 modules) export in about 22 s, mostly SVDs;
rank 16 in float16 is 9.8 MB. Expected errors print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from optima_env.backends.peft_adapter import (
    MANIFEST,
    content_hash,
    file_sha256,
    is_adapter,
    verify_manifest,
)
from optima_env.cli_support import (
    Parser,
    add_common_flags,
    add_field_flags,
    dataclass_from_args,
    run_command,
    setup_logging,
)
from optima_env.errors import DataError, TaskContractError
from optima_env.models import source_folder
from optima_trainers.cli.lora_svd import TOLERANCE, factorize, write_adapter
from optima_trainers.host.checkpoint import is_complete, require_complete
from optima_trainers.host.provenance import git_commit

__all__ = [
    "DTYPES",
    "FORMAT",
    "TOLERANCE",
    "TRUNCATION_WARNING",
    "ExportArgs",
    "build_parser",
    "export_lora",
    "main",
]

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
    logger.info("exported %s in %.1f s into %s: %s", trained, manifest["seconds"], out, _summary(manifest))
    return manifest


def _summary(manifest: Mapping[str, Any]) -> str:
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


@dataclass(frozen=True, kw_only=True)
class ExportArgs:
    """The options of ``python -m optima_trainers.cli.export`` (each becomes a ``--flag``)."""

    base: str = "embedded"
    """Base model: embedded, a Hugging Face name or a folder."""
    model: str
    """The trained full model folder (a checkpoint)."""
    out: str
    """The adapter folder to write."""
    rank: int = 16
    """LoRA rank r."""
    dtype: Dtype = "float16"
    """dtype of the stored factors."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m optima_trainers.cli.export``: one flag per :class:`ExportArgs`
    field, plus the common ``--debug``, ``--log-level`` and ``--quiet``."""
    parser = Parser("python -m optima_trainers.cli.export", __doc__)
    add_field_flags(parser, ExportArgs)
    add_common_flags(parser)
    return parser


def _check_flags(args: ExportArgs) -> None:
    """Refuse flags that cannot work before any model is loaded (one line each, exit 2)."""
    from optima_env.paths import check_model_flag, check_output_folder

    check_model_flag("--base", args.base)
    check_model_flag("--model", args.model, names=())
    check_output_folder("--out", args.out)
    if args.rank < 1:
        raise DataError(f"--rank must be at least 1 (the LoRA rank), got {args.rank}; pass e.g. --rank 16")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (:mod:`optima_env.cli_support`: 0 ok, 2 on a usage or
    data error, 130 when interrupted, 1 on a bug)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    target: list[str] = ["--out"]

    def body() -> None:
        ns = build_parser().parse_args(argv)
        setup_logging(ns)
        args = dataclass_from_args(ExportArgs, ns)
        target[0] = args.out
        provenance = {
            "command": shlex.join(["python", "-m", "optima_trainers.cli.export", *argv]),
            "git_commit": git_commit(Path.cwd()),
            "model": args.model,
        }
        _check_flags(args)
        out = Path(args.out)
        manifest = export_lora(
            args.base, args.model, out, rank=args.rank, dtype=args.dtype, provenance=provenance
        )
        print(f"{out}: {_summary(manifest)}")

    return run_command(
        body,
        argv=argv,
        on_interrupt=lambda _: f"interrupted; nothing was written to {target[0]}: rerun the same command",
    )


if __name__ == "__main__":
    sys.exit(main())
