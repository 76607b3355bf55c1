"""A LoRA stage keeps its adapter, and a checkpoint whose weights are gone is rebuilt from it.

A LoRA-trained checkpoint (:func:`save_lora_checkpoint`, called by the SFT and DPO trainers) holds
the merged model, which every later stage, rollout and evaluation loads, and beside it, in
``adapter/``, the adapter it was merged from: PEFT's own folder (``adapter_config.json``,
``adapter_model.safetensors``, in the training dtype). Both are listed in the checkpoint's
``COMPLETE`` manifest (:mod:`optima_trainers.run.checkpoint`).

The adapter is small (the embedded model, r 16 on every linear layer, fp32: about 19 MB against
the 540 MB merged model), so a run folder can travel without its merged weights (a commit, a copy
to another machine, a machine that starts empty every session), and without its tokenizer files
(3.5 MB, the same in every stage): :func:`restore_weights` merges the stage's adapter into its
start model again, takes the tokenizer's files from the start model, and accepts each file only
when its sha256 equals the manifest's, i.e. the rebuilt checkpoint is the trained one, bit for
bit. :class:`~optima_trainers.host.loop.IterativeTrainer` calls it for every finished stage
whose weights are missing when a run resumes.

Why our own code: PEFT saves, loads and merges adapters (all three are its calls here); what it
does not have is the run's bookkeeping, which stage's adapter merges into which start model, and
the check of the rebuilt files against the checkpoint's manifest.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optima_env.backends.peft_adapter import ADAPTER_WEIGHTS, file_sha256
from optima_env.errors import CorruptCheckpointError, DataError, require
from optima_trainers.run.checkpoint import is_complete, manifest_entries

__all__ = ["ADAPTER_FOLDER", "missing_files", "restore_weights", "save_lora_checkpoint", "stack_adapters"]

logger = logging.getLogger("optima_trainers.run.adapters")

ADAPTER_FOLDER = "adapter"
"""The adapter's folder inside a LoRA-trained checkpoint."""


def save_lora_checkpoint(model: Any, folder: str | os.PathLike[str]) -> None:
    """Save a trained PEFT model into ``folder``: its adapter into ``folder/adapter``, then the
    model with the adapter merged into the weights (the folder every later stage loads)."""
    folder = Path(folder)
    model.save_pretrained(str(folder / ADAPTER_FOLDER))
    model.merge_and_unload().save_pretrained(str(folder))


def missing_files(checkpoint: str | os.PathLike[str]) -> list[str]:
    """The files a complete checkpoint's manifest lists that are not in its folder (sorted); empty
    for a checkpoint that is whole, or one without a manifest."""
    checkpoint = Path(checkpoint)
    return sorted(name for name in manifest_entries(checkpoint) if not (checkpoint / name).is_file())


def _same_file(path: Path, entry: dict[str, Any]) -> bool:
    """Whether ``path`` is a file with the manifest entry's size and sha256."""
    return (
        path.is_file()
        and path.stat().st_size == entry.get("size")
        and file_sha256(path) == entry.get("sha256")
    )


def restore_weights(
    checkpoint: str | os.PathLike[str], start_model: str, *, dtype: str = "float32"
) -> list[str]:
    """Write the missing files of a complete LoRA checkpoint by merging its ``adapter/`` into
    ``start_model`` (the model its stage trained from) again; returns the names written. A missing
    file that the merge does not write (the tokenizer's, which a stage copies unchanged from its
    start model) is copied from ``start_model``'s folder when it is the same file.

    Each rebuilt file must have the sha256 that the manifest recorded when the stage finished;
    files appear one by one by atomic rename, so concurrent restores of one folder (the processes
    of a data-parallel run) are safe. Nothing is written when nothing is missing.

    Raises:
        CorruptCheckpointError: the checkpoint is not complete, a missing file is one of the
            adapter's, a rebuilt file differs from the manifest, or a missing file is not among
            those the merge writes. The message says what to do (delete the stage's folder and
            resume: the stage is trained again).
    """
    checkpoint = Path(checkpoint)
    fix = f"delete {checkpoint.parent} and resume the run, which trains that stage again"
    if not is_complete(checkpoint):
        raise CorruptCheckpointError(f"{checkpoint} is not a complete checkpoint; {fix}")
    missing = missing_files(checkpoint)
    if not missing:
        return []
    adapter = checkpoint / ADAPTER_FOLDER
    lost = [m for m in missing if m.startswith(f"{ADAPTER_FOLDER}/")]
    if lost or not (adapter / "adapter_config.json").is_file():
        raise CorruptCheckpointError(
            f"{checkpoint}: {', '.join(missing)} missing and no adapter to rebuild them from "
            f"(expected {adapter} with its files, as a LoRA stage writes it); {fix}"
        )
    torch = require("torch", "train")
    transformers = require("transformers", "train")
    peft = require("peft", "train")
    tmp = checkpoint.parent / f".{checkpoint.name}.restore-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(start_model, dtype=getattr(torch, dtype))
        merged = peft.PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
        merged.save_pretrained(str(tmp))
        del model, merged
        entries = manifest_entries(checkpoint)
        for name in missing:
            rebuilt = tmp / name
            if not rebuilt.is_file() and _same_file(Path(start_model) / name, entries[name]):
                shutil.copyfile(Path(start_model) / name, rebuilt)  # the tokenizer: the start model's
            if not rebuilt.is_file():
                raise CorruptCheckpointError(
                    f"{checkpoint / name}: missing, and neither merging the adapter into {start_model} "
                    f"(it wrote {sorted(p.name for p in tmp.iterdir())}) nor the start model's folder "
                    f"gives it; {fix}"
                )
            if file_sha256(rebuilt) != entries[name].get("sha256"):
                raise CorruptCheckpointError(
                    f"{checkpoint / name}: the adapter merged into {start_model} gives other bytes "
                    f"than the stage wrote (sha256 differs from the manifest): the start model is "
                    f"not the stage's, or the adapter was altered; {fix}"
                )
        for name in missing:
            os.replace(tmp / name, checkpoint / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("restored %s of %s from its adapter", ", ".join(missing), checkpoint)
    return missing


_NOT_STACKABLE = ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save")


def stack_adapters(adapters: Sequence[str | os.PathLike[str]]) -> tuple[dict[str, tuple[Any, Any]], int]:
    """The LoRA factors ``{module: (A, B)}`` (fp32, scaling 1) whose weight change is exactly the
    sum of ``adapters``' changes, and their rank: the adapters of successive stages, each trained
    on the model the ones before it were merged into, so the last stage's model is the first
    stage's start model plus that sum. For each module the stages' ``A`` are stacked and their
    ``B``, each times its own scaling (``lora_alpha / r``, or ``/ sqrt(r)`` with rsLoRA), set side
    by side: ``B @ A = sum_i s_i B_i @ A_i``. The rank is the sum of the stages' ranks.

    Raises:
        DataError: an adapter is not a plain LoRA (DoRA, per-module ranks, trained biases or other
            modules saved), or the stages adapt different modules.
    """
    torch = require("torch", "train")
    safetensors_torch = require("safetensors.torch", "train")
    factors: dict[str, tuple[list[Any], list[Any]]] = {}
    rank = 0
    for number, folder in enumerate(Path(a) for a in adapters):
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
        unsupported = [k for k in _NOT_STACKABLE if config.get(k)]
        if config.get("bias", "none") != "none":
            unsupported.append("bias")
        if unsupported:
            raise DataError(f"{folder}: {unsupported} set; only plain LoRA adapters stack exactly")
        r, alpha = int(config["r"]), float(config["lora_alpha"])
        scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        weights = safetensors_torch.load_file(str(folder / ADAPTER_WEIGHTS))
        modules = {k[: -len(".lora_A.weight")] for k in weights if k.endswith(".lora_A.weight")}
        if number and modules != set(factors):
            raise DataError(f"{folder} adapts other modules than the stages before it; they do not stack")
        for module in modules:
            a = weights[f"{module}.lora_A.weight"].to(torch.float32)
            b = weights[f"{module}.lora_B.weight"].to(torch.float32) * scale
            factors.setdefault(module, ([], []))[0].append(a)
            factors[module][1].append(b)
        rank += r
    prefix = "base_model.model."
    stacked = {m.removeprefix(prefix): (torch.cat(a), torch.cat(b, dim=1)) for m, (a, b) in factors.items()}
    return stacked, rank
