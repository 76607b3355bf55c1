"""Presets and compute profiles: named mappings of dotted configuration names to values.

Applied by :func:`optima_trainers.config.train.resolve_config` (see its module docstring for the order).
"""

from __future__ import annotations

from typing import Any

from optima_env.reward import PAPER_SPECIAL_CASES

__all__ = ["FIDELITY_PRESETS", "PROFILES", "REWARD_PRESETS"]

REWARD_PRESETS: dict[str, dict[str, Any]] = {
    "code": {},
    "paper": {f"reward.{name}": value for name, value in PAPER_SPECIAL_CASES.items()},
}
"""``code``: the reference's special cases (spec §3); ``paper``: Eq. 1 alone, no special case (the
tree reward derives from ``reward``, so it follows)."""

FIDELITY_PRESETS: dict[str, dict[str, Any]] = {
    "code": {},
    "paper": {
        "selection.threshold_on": "task",  # §13.1: R_task > θ (code: total reward >= θ)
        "selection.order": "paper",  # §13.2: threshold, then the top 70% of the survivors
        "tree.normalizer": "instance_max",  # §13.3: per-instance max (code: 85th percentile + 1)
        "tree.pair_rule": "shared_ancestor",  # §13.7: node pairs sharing an ancestor
        "tree.edit_distance": "max_length",  # §13.8: ed / max length (code: + 1 forms)
        "generation.termination": "all_agents",  # §13.12: all agents give the same answer
    },
}
"""The algorithm switches of spec §13 where the paper and the reference code differ: ``code`` (the
defaults) and ``paper``, applied with ``preset="paper"`` after the reward preset."""

_PAPER_SIZES: dict[str, Any] = {
    "generation.max_turns": 10, "generation.max_new_tokens": 2000, "generation.concurrency": None,
    "generation.batch_size": 64,
    "sft.max_length": 2048, "sft.per_device_batch_size": 1, "sft.eval_fraction": 0.02,
    "sft.warmup_ratio": 0.1, "tree.normalizer_instances": 100,
    "dpo.max_length": 4096, "dpo.per_device_batch_size": 1, "dpo.batch_size": 64, "dpo.warmup_ratio": 0.1,
}  # fmt: skip

PROFILES: dict[str, dict[str, Any]] = {
    "paper": {
        **_PAPER_SIZES,
        "sft.lora": True, "sft.learning_rate": 1e-4, "dpo.lora": True, "dpo.learning_rate": 5e-6,
    },
    "paper-full": {**_PAPER_SIZES, "sft.lora": False, "dpo.lora": False, "dpo.learning_rate": 5e-7},
    "cpu": {
        "generation.instances": 6, "generation.num_samples": 3, "generation.max_turns": 4,
        "generation.max_new_tokens": 32, "generation.stop_at_speaker_tags": True,
        "generation.concurrency": None, "generation.batch_size": 32,
        "sft.max_length": 1024, "sft.per_device_batch_size": 2, "sft.batch_size": 8, "sft.lora": True,
        "sft.learning_rate": 1e-4, "sft.epochs": 1, "sft.eval_fraction": 0.0, "sft.warmup_ratio": 0.0,
        "tree.normalizer_instances": 8, "tree.instances": 2, "tree.selections": 4, "tree.rollouts": 2,
        "dpo.max_length": 1024, "dpo.per_device_batch_size": 2, "dpo.batch_size": 8, "dpo.lora": True,
        "dpo.learning_rate": 5e-5, "dpo.warmup_ratio": 0.0,
    },
}  # fmt: skip
"""Compute profiles. LoRA is the default in every profile:

* ``paper``: the spec's sizes (2,000-token turns, 100 normalizer conversations, DPO batch 64) with
  LoRA adapters (r 16, all linear layers) at LoRA-sized learning rates (SFT 1e-4, DPO 5e-6: the
  recipes' 2e-5 / 1e-6 / 5e-7 are full-fine-tuning values, too small for an adapter; these two are
  this project's choice, not the paper's). With a GPU: bf16 and gradient checkpointing
  (``TrainConfig.dtype="auto"``).
* ``paper-full``: the spec's sizes with full fine-tuning at the recipes' learning rates, as the
  reference trains (opt-in). Its memory, for an 8B model trained with AdamW in bf16 mixed
  precision: 16 GB of bf16 weights + 16 GB of bf16 gradients + 96 GB of fp32 master weights and
  Adam moments (3 x 4 bytes x 8e9) = 128 GB before activations: more than one 80 GB or 141 GB GPU;
  DeepSpeed ZeRO-3 over 8 GPUs holds 16 GB each (README "Scaling out").
* ``cpu``: minutes on 2 CPU cores (LoRA with a LoRA-sized learning rate, short turns, the
  speaker-tag stops).

Every profile sizes the conversations in flight from the engine (``generation.concurrency``
``None``: its ``capacity``): 64 (``paper``) or 32 (``cpu``) batch slots on the transformers engine
(``generation.batch_size``), vLLM's ``max_num_seqs`` on vLLM.

A trainer adds its own per-profile values (``TrainerSpec.profiles``)."""
