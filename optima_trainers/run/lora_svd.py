"""The SVD at the heart of :mod:`optima_trainers.cli.export`: a weight change as LoRA factors.

:func:`factorize` compares a trained model folder with its base, checks that only ``nn.Linear``
weights changed (the rest within :data:`TOLERANCE`), and gives each changed weight's truncated SVD
``Δ ≈ B @ A`` at rank ``r`` with its relative error; :func:`write_adapter` writes the factors as a
PEFT LoRA folder. The method and why it is hand-written are in :mod:`optima_trainers.cli.export`'s
docstring.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optima_env.backends.peft_adapter import ADAPTER_WEIGHTS
from optima_env.errors import DataError, require

__all__ = ["TOLERANCE", "factorize", "write_adapter"]

TOLERANCE = 1e-4
"""Largest relative Frobenius difference ``‖W_trained − W_base‖ / ‖W_base‖`` of a weight that a
LoRA cannot carry (embedding, norm, bias) for it to count as unchanged."""


# size: per-module truncated SVD of the weight change with its error bookkeeping, one pass over the model
def factorize(
    base: Path, trained: Path, rank: int, dtype: str
) -> tuple[dict[str, tuple], list[float], float]:
    """``({module: (A, B)}, relative errors, largest relative change of the other weights)``."""
    torch = require("torch", "train")
    transformers = require("transformers", "train")
    load = transformers.AutoModelForCausalLM.from_pretrained
    base_model, trained_model = load(base, dtype=torch.float32), load(trained, dtype=torch.float32)
    for name in ("model_type", "architectures"):
        if getattr(base_model.config, name, None) != getattr(trained_model.config, name, None):
            raise DataError(
                f"{trained}: config {name} {getattr(trained_model.config, name, None)!r} differs from the "
                f"base's {getattr(base_model.config, name, None)!r} ({base}); export against its own base"
            )
    linear = {n for n, m in trained_model.named_modules() if isinstance(m, torch.nn.Linear)}
    old, new = base_model.state_dict(), trained_model.state_dict()
    if set(old) != set(new):
        names = sorted(set(old) ^ set(new))
        raise DataError(f"{trained}: parameters {names[:5]} are in only one of it and the base {base}")
    for key, tensor in new.items():
        if tensor.shape != old[key].shape:
            raise DataError(
                f"{trained}: {key} has shape {tuple(tensor.shape)}, the base {base} {tuple(old[key].shape)} "
                "(a resized vocabulary?); a LoRA adapter cannot carry a new shape: export the full folder"
            )
    carried = {k for k in new if k.endswith(".weight") and k[: -len(".weight")] in linear}
    shared = {t.data_ptr() for k, t in new.items() if k not in carried}
    tied = {k for k in carried if new[k].data_ptr() in shared}  # lm_head tied to the embedding
    stored = _stored_dtype(trained, torch)

    def unchanged(key: str) -> Any:  # the base weight as the trained folder would store it
        return old[key].to(stored).float() if stored is not None else old[key]

    cast = getattr(torch, dtype)
    factors: dict[str, tuple] = {}
    errors: list[float] = []
    changed: list[tuple[str, float]] = []
    untouched = 0.0
    for key, tensor in new.items():
        if key in tied:
            continue
        if not tensor.is_floating_point():
            if not torch.equal(tensor, old[key]):
                changed.append((key, float("inf")))
            continue
        if key not in carried:
            reference = unchanged(key)
            difference = float((tensor - reference).norm() / reference.norm().clamp_min(1e-12))
            untouched = max(untouched, difference)
            if difference > TOLERANCE:
                changed.append((key, difference))
            continue
        if torch.equal(tensor, unchanged(key)):
            continue
        delta = tensor - old[key]
        u, s, vh = torch.linalg.svd(delta, full_matrices=False)
        keep = min(rank, s.numel())
        root = s[:keep].sqrt()
        b = torch.zeros(delta.shape[0], rank)
        a = torch.zeros(rank, delta.shape[1])
        b[:, :keep] = u[:, :keep] * root
        a[:keep] = root[:, None] * vh[:keep]
        a, b = a.to(cast), b.to(cast)
        errors.append(float((delta - b.float() @ a.float()).norm() / delta.norm()))
        factors[key[: -len(".weight")]] = (a.contiguous(), b.contiguous())
    if changed:
        shown = ", ".join(f"{k} ({d:.1e})" for k, d in sorted(changed, key=lambda x: -x[1])[:8])
        raise DataError(
            f"{trained}: a LoRA adapter carries only nn.Linear weights, but {len(changed)} other weight(s) "
            f"differ from the base {base} by more than {TOLERANCE:g} (relative Frobenius): {shown}; "
            "export a model trained with those frozen (LoRA on all-linear), or keep the full model folder"
        )
    if not factors:
        raise DataError(f"{trained}: no linear weight differs from the base {base}; nothing to export")
    return factors, errors, untouched


def _stored_dtype(folder: Path, torch: Any) -> Any:
    """The 16-bit dtype the folder's ``config.json`` says its weights are stored in, else None.

    A checkpoint saved in bfloat16 rounds every weight: the other weights are then compared with
    the base rounded the same way, and a linear weight equal to its rounded base is unchanged.
    """
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        name = config.get("dtype") or config.get("torch_dtype")
    except (OSError, ValueError, AttributeError):
        return None
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(str(name))


def write_adapter(folder: Path, factors: Mapping[str, tuple], *, base_model: str, rank: int) -> int:
    """Write ``adapter_config.json`` and the weights; returns the number of stored parameters."""
    peft = require("peft", "train")
    safetensors_torch = require("safetensors.torch", "train")
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=rank,
        lora_dropout=0.0,
        bias="none",
        target_modules=sorted(factors),
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
        inference_mode=True,
    )
    config.save_pretrained(str(folder))
    # PEFT keeps target_modules as a set, so the file's order changed with the hash seed: sorted,
    # the same weights always give the same bytes (and the same sha256 in the manifest)
    path = folder / "adapter_config.json"
    stored = json.loads(path.read_text(encoding="utf-8"))
    stored["target_modules"] = sorted(stored["target_modules"])
    path.write_text(json.dumps(stored, indent=2, sort_keys=True), encoding="utf-8")
    tensors = {}
    for name, (a, b) in factors.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = a
        tensors[f"base_model.model.{name}.lora_B.weight"] = b
    safetensors_torch.save_file(tensors, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())
