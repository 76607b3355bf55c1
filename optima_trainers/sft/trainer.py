"""SFT on masked examples with TRL's ``SFTTrainer`` (LoRA by default, or full fine-tuning).

The examples come pre-tokenized from :mod:`optima_trainers.sft.data`: columns ``input_ids`` and
``assistant_masks``. TRL 1.16 accepts that as is: a dataset with ``input_ids`` is "already
processed", and its ``assistant_masks`` column is folded into ``labels`` (``-100`` outside the
mask) before training, whatever ``completion_only_loss`` says; no chat-template ``{% generation %}``
markers are needed. Precision follows the run's ``dtype``: on a GPU bf16 mixed precision (TF32
matmuls allowed) with gradient checkpointing by default; on a CPU the weights in that dtype
without autocast (fp32 by default: this project's CPUs have no native bf16, see
``docs/feasibility.md``) and no gradient checkpointing.

The checkpoint is written atomically (:func:`optima_trainers.run.checkpoint.atomic_checkpoint`) as a
plain model folder: LoRA adapters are merged into the weights first, so the next iteration, a
rollout or an evaluation loads it like any model; the adapter itself is kept in ``adapter/``
(:mod:`optima_trainers.run.adapters`: a run folder without the merged weights is rebuilt from it). Under ``accelerate launch`` every process trains
and the main process writes the folder (with DeepSpeed ZeRO-3, use full fine-tuning: the weights
are gathered by ``Trainer.save_model``).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optima_env.errors import TaskContractError, require
from optima_trainers.config.training import SFTTrainConfig
from optima_trainers.run.adapters import save_lora_checkpoint
from optima_trainers.run.checkpoint import TrainResult, atomic_checkpoint, require_complete
from optima_trainers.run.faults import fault_point
from optima_trainers.run.memory import release, track
from optima_trainers.run.trl import (
    allow_tf32,
    check_report_to,
    checkpointing_for,
    free_trainer,
    lora_config,
    world_size,
)
from optima_trainers.sft.data import MaskedExample

__all__ = ["train_sft"]

logger = logging.getLogger(__name__)


def _dataset(examples: Sequence[MaskedExample]) -> Any:
    datasets = require("datasets", "train")
    return datasets.Dataset.from_dict(
        {
            "input_ids": [list(e.input_ids) for e in examples],
            "assistant_masks": [list(e.assistant_masks) for e in examples],
        }
    )


# size: assembles TRL's SFTTrainer step by step (examples, model, LoRA, config, train, atomic save)
def train_sft(
    *,
    model_path: str,
    examples: Sequence[MaskedExample],
    config: SFTTrainConfig,
    output_dir: str | os.PathLike[str],
    eval_examples: Sequence[MaskedExample] = (),
    logging_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    dtype: str = "float32",
    report_to: str = "none",
) -> TrainResult:
    """Fine-tune ``model_path`` on ``examples`` and save the merged model to ``output_dir``.

    Args:
        model_path: the starting model folder (or hub name).
        examples: masked training examples (at least one).
        config: hyperparameters.
        output_dir: where the checkpoint appears, complete or not at all.
        eval_examples: optional held-out examples (evaluated once at the end).
        logging_dir: where the trainer's own files go (tensorboard events); default: a folder
            beside ``output_dir``.
        seed: the run's seed (weights init of LoRA, data order).
        dtype: ``float32`` (CPU) or ``bfloat16`` (GPU only).
        report_to: ``none``, ``tensorboard`` or ``wandb``.

    Returns:
        The :class:`TrainResult` (also stored in the checkpoint's ``COMPLETE`` marker).
    """
    if not examples:
        raise TaskContractError(
            "train_sft got no examples; lower theta_sft or sample more instances (the selection kept none)"
        )
    torch = require("torch", "train")
    transformers = require("transformers", "train")
    trl = require("trl", "train")
    check_report_to(report_to)
    output_dir = Path(output_dir)
    trainer_dir = Path(logging_dir or output_dir.parent / f"{output_dir.name}_trainer")

    transformers.set_seed(seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    per_device = max(1, min(config.per_device_batch_size, config.batch_size))
    accumulation = max(1, math.ceil(config.batch_size / (per_device * world_size())))
    use_cuda = torch.cuda.is_available()
    allow_tf32(torch)
    args = trl.SFTConfig(
        output_dir=str(trainer_dir),
        per_device_train_batch_size=per_device,
        per_device_eval_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps if config.max_steps is not None else -1,
        learning_rate=config.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=config.warmup_ratio,
        max_length=config.max_length,
        bf16=dtype == "bfloat16" and use_cuda,  # CPU: bf16 weights, no autocast (feasibility study)
        fp16=False,
        gradient_checkpointing=checkpointing_for(config.gradient_checkpointing, use_cuda),
        use_cpu=not use_cuda,
        seed=seed,
        data_seed=seed,
        report_to=report_to,
        save_strategy="no",
        eval_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
        dataset_num_proc=None,
    )

    class _FaultCallback(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            fault_point("train_step")

    trainer = trl.SFTTrainer(
        model=model,
        args=args,
        train_dataset=_dataset(examples),
        eval_dataset=_dataset(eval_examples) if eval_examples else None,
        processing_class=tokenizer,
        peft_config=lora_config(config.lora_r, config.lora_alpha, config.lora_dropout)
        if config.lora
        else None,
        callbacks=[_FaultCallback()],
    )
    track("sft", model, trainer)
    output = trainer.train()
    metrics: dict[str, float] = {
        k: float(v) for k, v in output.metrics.items() if isinstance(v, (int, float)) and k != "total_flos"
    }
    if eval_examples:
        metrics.update({k: float(v) for k, v in trainer.evaluate().items() if isinstance(v, (int, float))})
    result = TrainResult(
        checkpoint=str(output_dir),
        train_loss=float(output.training_loss) if output.global_step else None,
        steps=int(output.global_step),
        num_examples=len(examples),
        metrics=metrics,
    )
    accelerator = trainer.accelerator
    if not accelerator.is_main_process:
        if not config.lora:
            trainer.save_model(str(output_dir.parent / f".{output_dir.name}.tmp-write"))  # ZeRO-3 gather
        accelerator.wait_for_everyone()
        _free(trainer)
        return result
    with atomic_checkpoint(output_dir) as (tmp, finish):
        if config.lora:
            save_lora_checkpoint(accelerator.unwrap_model(trainer.model), tmp)  # adapter/ + merged
        else:
            trainer.save_model(str(tmp))
        tokenizer.save_pretrained(tmp)
        fault_point("checkpoint")
        accelerator.wait_for_everyone()
        finish(result)
    shutil.rmtree(trainer_dir / "checkpoint-final", ignore_errors=True)
    logger.info("saved %s (loss %s, %d steps)", output_dir, result.train_loss, result.steps)
    del model
    _free(trainer)
    return require_complete(output_dir, verify=False)  # hashed once, as it was written


def _free(trainer: Any) -> None:
    free_trainer(trainer)
    del trainer
    release()
