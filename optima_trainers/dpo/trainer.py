"""DPO (and RPO) training of one iteration on TRL's ``DPOTrainer`` (spec §6.5, §7, §13 item 14).

iDPO trains with the RPO loss, DPO (sigmoid, β) plus α times the length-normalized NLL of the
chosen turn, α = 1 (the reference code's ``rpo_alpha=1.0``). TRL 1.16 has no ``rpo_alpha``
field; the same loss is ``loss_type=["sigmoid", "sft"]`` with ``loss_weights=[1.0, α]`` (its
``sft`` term is the mean negative log-likelihood over the chosen completion tokens of the batch).
iSFT-DPO's DPO stage is plain DPO (``rpo_alpha=None``).

The reference model is the starting checkpoint, i.e. the previous iteration's model: with LoRA
TRL computes the reference log-probabilities with the adapter disabled, which is exactly that
model; in full fine-tuning TRL loads a frozen copy of it (or the ``ref_model_path`` given). The
result is saved with the LoRA merged into the weights, and the adapter kept in ``adapter/``
(:mod:`optima_trainers.run.adapters`), atomically
(:func:`~optima_trainers.run.checkpoint.atomic_checkpoint`: temporary folder, ``COMPLETE`` marker
last, rename), so a folder without the marker is never loaded.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optima_env.errors import DataError, TaskContractError, require
from optima_env.io import write_json_atomic
from optima_trainers.config.training import DPOTrainConfig
from optima_trainers.dpo.metrics import numbers, result_metrics, split_loss_trainer
from optima_trainers.dpo.pairs import pairs_to_dpo_dataset
from optima_trainers.run.adapters import save_lora_checkpoint
from optima_trainers.run.checkpoint import TrainResult, atomic_checkpoint, is_complete
from optima_trainers.run.faults import fault_point
from optima_trainers.run.memory import release, track
from optima_trainers.run.records import PreferencePair
from optima_trainers.run.trl import allow_tf32, checkpointing_for, free_trainer, world_size

__all__ = ["LOG_FILE", "dpo_args", "train_dpo"]

LOG_FILE = "dpo_log.json"
"""TRL's log history (loss, rewards/accuracies, ... per logging step), saved in the checkpoint."""

logger = logging.getLogger(__name__)


def dpo_args(
    config: DPOTrainConfig,
    *,
    output_dir: str | os.PathLike[str],
    report_to: str | list[str] = "none",
    seed: int = 0,
    evaluate: bool = False,
    dtype: str = "float32",
):
    """The TRL ``DPOConfig`` of a stage (bf16 mixed precision and gradient checkpointing on a GPU
    unless the config says otherwise; CPU when there is no GPU); ``evaluate``: evaluate the eval
    dataset at the end of every epoch, one pair a batch, so ``eval_rewards/accuracies`` is the share
    of held-out pairs ranked right."""
    torch = require("torch", "train")
    trl = require("trl", "train")
    use_cuda = torch.cuda.is_available()
    allow_tf32(torch)
    per_device = min(config.per_device_batch_size, config.batch_size)
    accumulation = max(1, math.ceil(config.batch_size / (per_device * world_size())))
    if config.rpo_alpha is None or config.rpo_scope == "credited":  # credited: the NLL is added by
        losses: dict[str, Any] = {"loss_type": ["sigmoid"]}  # split_loss_trainer, per pair
    else:
        losses = {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, float(config.rpo_alpha)]}
    return trl.DPOConfig(
        output_dir=str(output_dir),
        beta=config.beta,
        **losses,
        learning_rate=config.learning_rate,
        num_train_epochs=config.epochs,
        per_device_train_batch_size=per_device,
        # one held-out pair a batch: TRL logs the mean of the eval batches' means, which is the share
        # of pairs ranked right only when every batch holds one pair (batches of 2 over 11 pairs
        # logged 0.5833, not k/11)
        per_device_eval_batch_size=1,
        gradient_accumulation_steps=accumulation,
        lr_scheduler_type=config.lr_scheduler,
        warmup_steps=config.warmup_ratio,  # transformers 5: a float in [0, 1) is a ratio of the steps
        max_length=config.max_length,
        bf16=dtype == "bfloat16" and use_cuda,  # CPU: bf16 weights, no autocast (minutes a step)
        fp16=False,
        gradient_checkpointing=checkpointing_for(config.gradient_checkpointing, use_cuda),
        use_cpu=not use_cuda,
        report_to=report_to,
        save_strategy="no",
        logging_steps=config.logging_steps,
        eval_strategy="epoch" if evaluate else "no",
        dataloader_num_workers=0,
        seed=seed,
        data_seed=seed,
        max_steps=config.max_steps if config.max_steps is not None else -1,
        precompute_ref_log_probs=config.precompute_ref_log_probs,
        **config.extra_args,
    )


def _fault_callback_class() -> Any:
    transformers = require("transformers", "train")

    class FaultCallback(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            fault_point("train_step")

    return FaultCallback


def _models(
    path: str, ref_model_path: str | None, config: DPOTrainConfig, dtype: str
) -> tuple[Any, Any, Any]:
    """The policy and the reference model when one is given, in the run's ``dtype``, and the LoRA
    config (or None)."""
    torch = require("torch", "train")
    transformers = require("transformers", "train")
    from optima_env.models import resolve_model_path

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    ref_model = None
    if ref_model_path is not None:
        ref_model = transformers.AutoModelForCausalLM.from_pretrained(
            resolve_model_path(ref_model_path), dtype=getattr(torch, dtype)
        )
    if not config.lora:
        return model, ref_model, None
    peft = require("peft", "train")
    target = config.lora_target_modules
    lora = peft.LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=target if isinstance(target, str) else list(target),
        task_type="CAUSAL_LM",
    )
    return model, ref_model, lora


def _prompt_tokens(tokenizer: Any, messages: Sequence[dict[str, str]]) -> int:
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


# size: assembles TRL's DPOTrainer step by step (data, model, LoRA, config, train, atomic save)
def train_dpo(
    *,
    model_path: str,
    pairs: Sequence[PreferencePair],
    config: DPOTrainConfig,
    output_dir: str | os.PathLike[str],
    ref_model_path: str | None = None,
    report_to: str | list[str] = "none",
    trainer_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    dtype: str = "float32",
) -> TrainResult:
    """Train one DPO/RPO stage from ``model_path`` on ``pairs`` and save the merged model.

    Args:
        model_path: the starting model (``embedded``, a hub name or a folder); with LoRA it is also
            the reference model.
        pairs: the preference pairs (see :func:`~optima_trainers.dpo.pairs.select_top_pairs`).
        config: the stage's settings.
        output_dir: where the merged model goes (written atomically; must not exist yet).
        ref_model_path: a different reference model (full fine-tuning only; default: the start).
        report_to: ``none``, ``tensorboard``, ``wandb``, ...
        trainer_dir: TRL's working folder (logs); default ``<output_dir>.trainer`` beside it.
        seed: the run's seed (LoRA init, data order).

    Returns:
        The :class:`~optima_trainers.run.checkpoint.TrainResult`: ``history`` holds TRL's whole log
        history (every logged step with :data:`~optima_trainers.dpo.metrics.DPO_METRICS`, every
        held-out evaluation as ``eval_*``); ``metrics`` ``wall_time_s``, ``num_dropped`` (pairs
        whose prompt alone exceeded ``max_length``) and the summary of
        :func:`~optima_trainers.dpo.metrics.result_metrics` (``eval_pairs``, ``epoch_<k>/*``,
        ``eval_loss``, ``eval_rewards/accuracies``, ... when evaluated).
    """
    transformers = require("transformers", "train")
    datasets = require("datasets", "train")
    from optima_env.models import resolve_model_path

    start = time.perf_counter()
    if not pairs:
        raise DataError("train_dpo got no preference pairs; lower theta_filter/theta_diff or grow more trees")
    if ref_model_path is not None and config.lora:
        raise TaskContractError(
            "with LoRA the reference model is the starting model (adapter disabled); "
            f"got ref_model_path={ref_model_path!r}: drop it, or set lora=False"
        )
    output_dir = Path(output_dir)
    if is_complete(output_dir):
        raise DataError(f"{output_dir} already holds a complete checkpoint; load it instead of retraining")
    path = resolve_model_path(model_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    credited = config.rpo_scope == "credited" and config.rpo_alpha is not None
    data = pairs_to_dpo_dataset(pairs, train_fraction=config.train_fraction, credited=credited)
    train_rows = [r for r in data.train if _prompt_tokens(tokenizer, r["prompt"]) < config.max_length]
    eval_rows = [r for r in data.eval if _prompt_tokens(tokenizer, r["prompt"]) < config.max_length]
    dropped = len(data.train) + len(data.eval) - len(train_rows) - len(eval_rows)
    if dropped:
        logger.warning(
            "dropping %d of %d pairs whose prompt alone has >= max_length=%d tokens "
            "(raise max_length to keep them)",
            dropped,
            len(pairs),
            config.max_length,
        )
    if not train_rows:
        raise DataError(
            f"every training pair's prompt has >= max_length={config.max_length} tokens; raise max_length"
        )

    model, ref_model, peft_config = _models(path, ref_model_path, config, dtype)
    trainer_dir = (
        Path(trainer_dir) if trainer_dir is not None else output_dir.with_name(output_dir.name + ".trainer")
    )
    evaluate = config.evaluate and bool(eval_rows)
    trainer = split_loss_trainer(credited_alpha=float(config.rpo_alpha) if credited else None)(
        model=model,
        ref_model=ref_model,
        args=dpo_args(
            config, output_dir=trainer_dir, report_to=report_to, seed=seed, evaluate=evaluate, dtype=dtype
        ),
        train_dataset=datasets.Dataset.from_list(train_rows),
        eval_dataset=datasets.Dataset.from_list(eval_rows) if evaluate else None,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[_fault_callback_class()()],
    )
    track("dpo", model, ref_model, trainer)
    del model, ref_model
    output = trainer.train()
    history = trainer.state.log_history
    if evaluate and not any("eval_loss" in h and h.get("step") == output.global_step for h in history):
        trainer.evaluate()  # the epochs' evaluations missed the last step (max_steps, a partial epoch)
    if config.evaluate and not eval_rows:
        logger.warning(
            "no held-out pair to evaluate (%d pairs, train_fraction %s)", len(pairs), config.train_fraction
        )
    metrics = result_metrics(
        history, output.metrics, dropped=dropped, eval_pairs=len(eval_rows) if evaluate else 0
    )
    metrics["wall_time_s"] = time.perf_counter() - start
    result = TrainResult(
        checkpoint=str(output_dir),
        train_loss=float(output.training_loss) if output.global_step else None,
        steps=int(output.global_step),
        num_examples=len(train_rows),
        metrics=metrics,
        history=tuple(numbers(h) for h in history),
    )
    accelerator = trainer.accelerator
    if not accelerator.is_main_process:  # under accelerate launch only the main process writes
        if not config.lora:
            trainer.save_model(str(output_dir.parent / f".{output_dir.name}.tmp-write"))  # ZeRO-3 gather
        accelerator.wait_for_everyone()
        free_trainer(trainer)
        del trainer
        release()
        return result
    with atomic_checkpoint(output_dir) as (tmp, finish):
        if config.lora:
            save_lora_checkpoint(accelerator.unwrap_model(trainer.model), tmp)  # adapter/ + merged
        else:
            trainer.save_model(str(tmp))  # gathers the weights under DeepSpeed ZeRO-3
        tokenizer.save_pretrained(tmp)
        write_json_atomic(tmp / LOG_FILE, trainer.state.log_history)
        fault_point("checkpoint")
        accelerator.wait_for_everyone()
        finish(result)
    free_trainer(trainer)  # the next phase (an engine, the next stage) needs the memory back
    del trainer
    release()
    return result
