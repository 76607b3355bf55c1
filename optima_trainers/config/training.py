"""The ``sft``, ``dpo`` and ``selection`` sections of the trainer configuration
(:class:`~optima_trainers.config.train.TrainConfig`): leaves, below the trainers that read them
(:mod:`optima_trainers.sft.trainer`, :mod:`optima_trainers.dpo.trainer`,
:mod:`optima_trainers.sft.selection`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from optima_env.errors import TaskContractError

__all__ = ["DPOTrainConfig", "LoRAOptions", "SFTTrainConfig", "SelectionConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoRAOptions:
    """The LoRA options of a training section, shared by :class:`SFTTrainConfig` and
    :class:`DPOTrainConfig` (their ``lora*`` fields: ``sft.lora_r``, ``dpo.lora_alpha``, ...)."""

    lora: bool = True
    """Train a LoRA adapter (merged into the weights when saved); False: full fine-tuning."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA alpha."""
    lora_dropout: float = 0.0
    """LoRA dropout."""

    def _check_lora(self, section: str) -> None:
        for name in ("lora_r", "lora_alpha"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TaskContractError(f"{section}.{name} must be an int >= 1, got {value!r}")
        if not (isinstance(self.lora_dropout, (int, float)) and 0 <= self.lora_dropout < 1):
            raise TaskContractError(f"{section}.lora_dropout must lie in [0, 1), got {self.lora_dropout!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SFTTrainConfig(LoRAOptions):
    """Hyperparameters of one SFT stage (the ``sft`` section of the trainer configuration).

    Defaults: the reference recipes' common values (spec §5) with LoRA; the task presets and the
    compute profile set the rest. The run's seed, dtype and tracker are arguments of
    :func:`train_sft`, not fields here, so that one value serves the whole run.
    """

    learning_rate: float = 2e-5
    """Peak learning rate (cosine schedule)."""
    epochs: float = 1
    """Epochs per stage."""
    batch_size: int = 32
    """Effective batch: per-device batch × gradient accumulation × processes."""
    per_device_batch_size: int = 1
    """Examples per device per forward pass."""
    max_length: int = 2048
    """Longest example in tokens (longer ones are cut at the end)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (``None``: run the epochs)."""
    gradient_checkpointing: bool | None = None
    """Recompute activations in the backward pass (less memory, about a third more compute).
    ``None``: on with a GPU, off on CPUs (where it only costs time), resolved when the run's
    configuration is built (``--print-config`` shows the value)."""
    warmup_ratio: float = 0.1
    """Linear warm-up fraction before the cosine schedule."""
    eval_fraction: float = 0.0
    """Fraction of the examples held out and evaluated once at the end (reference: 0.02)."""
    restart_from_base: bool = False
    """Every SFT stage starts from the base model (debate tasks, spec §5 item 8) instead of the
    previous stage's model; the initialization always starts from the base model."""
    train_capped_turns: bool = True
    """Train on turns that ran to the generation cap (``generation.max_new_tokens``). With
    ``False`` such a turn stays in the conversation as context but is not a target: its
    end-of-message marker is where the cap cut it, not where the model stopped, so training on it
    teaches a stop the model never made. The reference's cap (2000 tokens) is rarely reached, so
    it trains every turn; a short cap (the cpu profile's) cuts many."""

    def __post_init__(self) -> None:
        self._check_lora("sft")
        for name in ("batch_size", "per_device_batch_size", "max_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TaskContractError(f"sft.{name} must be an int >= 1, got {value!r}")
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < 1):
            raise TaskContractError(f"sft.max_steps must be None or an int >= 1, got {self.max_steps!r}")
        if not (isinstance(self.learning_rate, (int, float)) and 0 < self.learning_rate < 1):
            raise TaskContractError(f"sft.learning_rate must lie in (0, 1), got {self.learning_rate!r}")
        if not (isinstance(self.epochs, (int, float)) and self.epochs > 0):
            raise TaskContractError(f"sft.epochs must be > 0, got {self.epochs!r}")
        for name in ("warmup_ratio", "eval_fraction"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value < 1):
                raise TaskContractError(f"sft.{name} must lie in [0, 1), got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DPOTrainConfig(LoRAOptions):
    """Settings of one DPO stage. Defaults: the reference iDPO recipe (spec §6.5) with LoRA;
    :meth:`cpu` gives small settings for the embedded model on a CPU."""

    beta: float = 0.1
    """DPO β (per task: spec §6 and §7 tables)."""
    rpo_alpha: float | None = 1.0
    """Weight of the NLL term (RPO): 1.0 for iDPO; ``None`` for plain DPO (iSFT-DPO)."""
    rpo_scope: Literal["all", "credited"] = "all"
    """Which chosen turns the NLL term trains: every pair's (``all``, TRL's ``sft`` term and the
    reference's RPO), or only those of pairs whose chosen side has task credit > 0 (``credited``:
    the tree stage then writes each pair's ``chosen_task``; see
    :func:`~optima_trainers.dpo.metrics.split_loss_trainer`). Beyond the reference."""
    learning_rate: float = 5e-7
    """Peak learning rate (reference: 5e-7, full fine-tuning)."""
    epochs: float = 1.0
    """Epochs per stage."""
    batch_size: int = 64
    """Effective batch in pairs (per-device batch × gradient accumulation × processes)."""
    per_device_batch_size: int = 1
    """Pairs per device per forward pass (capped at ``batch_size``)."""
    max_length: int = 4096
    """Longest prompt + completion in tokens; a pair whose prompt alone fills it is dropped (logged)."""
    lr_scheduler: str = "cosine"
    """Learning-rate schedule (transformers' names)."""
    warmup_ratio: float = 0.1
    """Linear warm-up fraction."""
    train_fraction: float = 0.9
    """The first 90% of the pairs train, the rest evaluate (not shuffled, spec §6.4)."""
    evaluate: bool = True
    """Evaluate on the held-out pairs (the last ``1 - train_fraction`` of them) at the end of every
    epoch and of the stage: TRL's ``eval_*`` metrics (reward accuracy and margins, log-probs, the
    loss and its DPO/NLL parts) go into the stage's history and metrics. A stage with too few
    pairs for a held-out one records ``eval_pairs`` 0 and no ``eval_*``."""
    gradient_checkpointing: bool | None = None
    """Recompute activations in the backward pass (less memory, about a third more compute).
    ``None``: on with a GPU, off on CPUs (where it only costs time), resolved when the run's
    configuration is built (``--print-config`` shows the value)."""
    lora_target_modules: str | tuple[str, ...] = "all-linear"
    """Modules that get adapters (``all-linear``: every linear layer of the blocks)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (``None``: run the epochs)."""
    logging_steps: int = 1
    """Log every this many steps."""
    precompute_ref_log_probs: bool = True
    """Compute the reference model's log-probabilities of every pair once, before the first step
    (TRL's ``precompute_ref_log_probs``), instead of one reference forward pass per step. The pairs
    are fixed before a stage trains (offline) and the reference is the stage's start (with LoRA,
    the adapter disabled), so the values are the same; what changes is when they are computed
    and, in full fine-tuning without ``ref_model_path``, that no frozen copy of the model is kept
    beside the policy. On by default: the same losses, and a stage of the demo's DPO recipe (2
    epochs) took 0.81x the time on 2 CPU cores (``benchmarks/results/dpo_ref``)."""
    extra_args: dict[str, Any] = field(default_factory=dict)
    """Further ``DPOConfig`` fields (e.g. ``{"max_grad_norm": 1.0}``)."""

    def __post_init__(self) -> None:
        if not self.beta > 0:
            raise TaskContractError(f"beta must be > 0, got {self.beta!r}")
        if self.rpo_scope not in ("all", "credited"):
            raise TaskContractError(f"dpo.rpo_scope must be 'all' or 'credited', got {self.rpo_scope!r}")
        if self.rpo_alpha is not None and not self.rpo_alpha >= 0:
            raise TaskContractError(f"rpo_alpha must be None (plain DPO) or >= 0, got {self.rpo_alpha!r}")
        self._check_lora("dpo")
        for name in ("batch_size", "per_device_batch_size", "max_length", "logging_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise TaskContractError(f"dpo.{name} must be an int >= 1, got {value!r}")
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < 1):
            raise TaskContractError(f"dpo.max_steps must be None or an int >= 1, got {self.max_steps!r}")
        if not 0 <= self.warmup_ratio < 1:
            raise TaskContractError(f"warmup_ratio must lie in [0, 1), got {self.warmup_ratio!r}")
        if not self.learning_rate > 0 or not self.epochs > 0:
            raise TaskContractError(
                f"learning_rate and epochs must be > 0, got {self.learning_rate!r} and {self.epochs!r}"
            )

    @classmethod
    def cpu(cls, **overrides: Any) -> DPOTrainConfig:
        """Small settings for the embedded model on 2 CPU cores: batch 2, max_length 512, and a
        learning rate (5e-6) large enough for a LoRA adapter to move in a few steps."""
        base: dict[str, Any] = dict(
            learning_rate=5e-6, batch_size=2, per_device_batch_size=2, max_length=512, warmup_ratio=0.0
        )
        return cls(**{**base, **overrides})


@dataclass(frozen=True, slots=True, kw_only=True)
class SelectionConfig:
    """How iSFT picks its training trajectories."""

    theta: float = 0.5
    """θ_sft: keep a trajectory only if its total reward is ``>= theta`` (or, with
    ``threshold_on="task"``, its task score is ``> theta``)."""
    threshold_on: Literal["total", "task"] = "total"
    """What θ_sft tests: the total reward with ``>=`` (the reference code) or the task score with
    ``>`` (the paper's Eq. 3, spec §13 item 1)."""
    keep: tuple[float, float] = (0.0, 0.7)
    """Slice of the reward-sorted instances to keep, as fractions (MATH: ``(0.1, 0.8)``)."""
    order: Literal["code", "paper"] = "code"
    """``code``: slice, then threshold; ``paper``: threshold, then slice of the survivors."""
    drop_impersonation: bool = True
    """Remove trajectories whose reward carries the ``impersonation_sft`` flag."""
    min_task_score: float | None = None
    """When set, only trajectories whose task score is ``>=`` this compete (before the best per
    instance is taken): e.g. ``1e-9`` keeps right or partly right answers only. Not in the paper;
    for models so weak that θ_sft on the total reward cannot tell a partial answer from a short
    wrong one."""

    def __post_init__(self) -> None:
        lo, hi = self.keep
        if not 0.0 <= lo < hi <= 1.0:
            raise TaskContractError(
                f"keep must be a slice (lo, hi) with 0 <= lo < hi <= 1, got {self.keep!r}"
            )
        if self.threshold_on not in ("total", "task"):
            raise TaskContractError(f"threshold_on must be 'total' or 'task', got {self.threshold_on!r}")
        if self.order not in ("code", "paper"):
            raise TaskContractError(f"order must be 'code' or 'paper', got {self.order!r}")
        if (
            isinstance(self.theta, bool)
            or not isinstance(self.theta, (int, float))
            or not math.isfinite(self.theta)
        ):
            raise TaskContractError(
                f"selection.theta must be a finite number (a total reward, e.g. 0.5), got {self.theta!r}"
            )
        score = self.min_task_score
        if score is not None and (
            isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 1
        ):
            raise TaskContractError(f"selection.min_task_score must be None or in [0, 1], got {score!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SelectionConfig:
        """Build from a plain dict (the ``config`` of the selection hook); unknown keys are ignored."""
        fields = {"theta", "threshold_on", "keep", "order", "drop_impersonation", "min_task_score"}
        values = {k: v for k, v in data.items() if k in fields}
        if "keep" in values:
            values["keep"] = tuple(values["keep"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what the loop passes to the selection hook)."""
        return {
            "theta": self.theta,
            "threshold_on": self.threshold_on,
            "keep": list(self.keep),
            "order": self.order,
            "drop_impersonation": self.drop_impersonation,
            "min_task_score": self.min_task_score,
        }
