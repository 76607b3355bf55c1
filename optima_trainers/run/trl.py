"""What the SFT and DPO trainers share around TRL: TF32, gradient checkpointing's default, the
process count, the tracker check, the project's LoRA setup, and freeing a finished trainer."""

from __future__ import annotations

import os
from typing import Any

from optima_env.errors import MissingDependencyError, TaskContractError, require

__all__ = ["allow_tf32", "check_report_to", "checkpointing_for", "free_trainer", "lora_config", "world_size"]


def allow_tf32(torch: Any) -> None:
    """TF32 matmuls on a GPU (Ampere and later: about twice the fp32 matmul speed, 10-bit mantissa
    inside the product; bf16 training is not affected)."""
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def checkpointing_for(setting: bool | None, use_cuda: bool) -> bool:
    """``gradient_checkpointing``: the config's value, or (``None``) on with a GPU, off on CPUs."""
    return use_cuda if setting is None else setting


def world_size() -> int:
    """Number of training processes (``WORLD_SIZE`` under ``accelerate launch``/``torchrun``)."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1")))


def check_report_to(report_to: str) -> None:
    """Fail early, with the install command, when the requested tracker is not installed."""
    module = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}.get(report_to)
    if module is None:
        if report_to != "none":
            raise TaskContractError(
                f"report_to must be none, tensorboard, trackio or wandb, got {report_to!r}"
            )
        return
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(
            f"report_to={report_to!r} needs `pip install {module}` (or `pip install 'optima[track]'`)"
        )


def lora_config(r: int, alpha: int, dropout: float = 0.0) -> Any:
    """The LoRA setup of the project: every linear layer of the blocks (``all-linear``)."""
    peft = require("peft", "train")
    return peft.LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules="all-linear", task_type="CAUSAL_LM"
    )


def free_trainer(trainer: Any) -> None:
    """Drop what a finished transformers/TRL trainer holds (accelerate's prepared model, optimizer
    and scheduler references, the trainer's own model), so that :func:`optima_trainers.run.memory.
    release` can return the memory before the next phase (a vLLM engine or the next stage)."""
    trainer.accelerator.free_memory()
    for name in ("model", "model_wrapped", "optimizer", "lr_scheduler", "ref_model"):
        if hasattr(trainer, name):
            setattr(trainer, name, None)
