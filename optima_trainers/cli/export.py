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
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from optima_env.cli_support import (
    Parser,
    add_common_flags,
    add_field_flags,
    dataclass_from_args,
    run_command,
    setup_logging,
)
from optima_env.errors import DataError
from optima_trainers.run.export import Dtype, export_lora, summary
from optima_trainers.run.provenance import git_commit

__all__ = ["ExportArgs", "build_parser", "main"]


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
        print(f"{out}: {summary(manifest)}")

    return run_command(
        body,
        argv=argv,
        on_interrupt=lambda _: f"interrupted; nothing was written to {target[0]}: rerun the same command",
    )


if __name__ == "__main__":
    sys.exit(main())
