"""optima_trainers: Optima's training variants (iSFT, iDPO, iSFT-DPO) on TRL and PEFT.

Public surface (importing this package does not import torch; training functions do)::

    from optima_trainers import resolve_config, RunDir, IterativeTrainer
    config = resolve_config("ie/synth-v0", "isft", profile="cpu", overrides={"reward.lambda_token": 0.4})
    IterativeTrainer(config, run_dir=RunDir.create(config)).run()

or, from a shell, ``python -m optima_trainers.train --task ie/synth-v0 --trainer isft``.

Everything the README and ``examples/`` import is an attribute of this package (``__all__``); most
load their module on first use. Adapters to other frameworks keep their own public namespace,
``optima_trainers.integrations.<framework>`` (e.g. ``integrations.trl`` for TRL's GRPO).

Modules (the folders that group them come with issue 28's next step):

* host: :mod:`~optima_trainers.loop` (the host loop), :mod:`~optima_trainers.generation` (its
  generation context and resumable rollouts), :mod:`~optima_trainers.sample_stage` /
  :mod:`~optima_trainers.tree_stage` (what a stage generates), :mod:`~optima_trainers.engines`
  (policies per stage; one vLLM engine per run), :mod:`~optima_trainers.memory` (the memory
  lifecycle), :mod:`~optima_trainers.hookspecs` (the training events),
  :mod:`~optima_trainers.runs` / :mod:`~optima_trainers.checkpoint` (persistence and resume),
  :mod:`~optima_trainers.faults` (fault points for the resume tests),
  :mod:`~optima_trainers.provenance` (the git commit a run records);
* contract and backends: :mod:`~optima_trainers.backends` (``TrainerBackend``, ``StageContext``, the
  built-in backends), :mod:`~optima_trainers.stages` (the records the host and backends exchange),
  :mod:`~optima_trainers.grpo` (the GRPO backend), :mod:`~optima_trainers.plugin` (registrations);
* configuration: :mod:`~optima_trainers.config` (the tree, layers, resolution),
  :mod:`~optima_trainers.sections` (its ``generation`` and ``tree`` sections),
  :mod:`~optima_trainers.presets` (reward presets, fidelity switches, compute profiles);
* SFT: :mod:`~optima_trainers.selection`, :mod:`~optima_trainers.sft_data`, :mod:`~optima_trainers.sft`;
* tree search and DPO: :mod:`~optima_trainers.mcts` (with :mod:`~optima_trainers.mcts_async` and
  :mod:`~optima_trainers.mcts_reward`), :mod:`~optima_trainers.tree`, :mod:`~optima_trainers.pairs`,
  :mod:`~optima_trainers.types`, :mod:`~optima_trainers.dpo` (with :mod:`~optima_trainers.dpo_metrics`);
* command line and tools: :mod:`~optima_trainers.cli` (``train``), :mod:`~optima_trainers.export`,
  :mod:`~optima_trainers.tracking`; adapters: :mod:`optima_trainers.integrations.trl`.
"""

from __future__ import annotations

from typing import Any

from optima_env.errors import CorruptCheckpointError
from optima_trainers.checkpoint import TrainResult
from optima_trainers.config import GenerationConfig, TrainConfig, TreeSearchConfig, resolve_config
from optima_trainers.runs import RunDir
from optima_trainers.selection import SelectionConfig, select_isft

__all__ = [
    "CorruptCheckpointError",
    "DPOTrainConfig",
    "GenerationConfig",
    "IDPOBackend",
    "ISFTBackend",
    "ISFTDPOBackend",
    "IterativeTrainer",
    "RunDir",
    "SelectionConfig",
    "Stage",
    "StageContext",
    "StageData",
    "StageOutcome",
    "TrainConfig",
    "TrainResult",
    "TrainerBackend",
    "TreeSearchConfig",
    "build_trees",
    "conversation_messages",
    "estimate_token_normalizer",
    "plan_stages",
    "resolve_config",
    "select_isft",
    "select_top_pairs",
    "sft_stages",
    "tokenize_with_mask",
    "train_dpo",
    "train_sft_stage",
    "write_pairs",
]

_LAZY = {  # loaded on first use: these modules reach the host loop and the backends
    "IterativeTrainer": "optima_trainers.loop",
    "plan_stages": "optima_trainers.loop",
    "TrainerBackend": "optima_trainers.backends",
    "StageContext": "optima_trainers.backends",
    "ISFTBackend": "optima_trainers.backends",
    "IDPOBackend": "optima_trainers.backends",
    "ISFTDPOBackend": "optima_trainers.backends",
    "sft_stages": "optima_trainers.backends",
    "train_sft_stage": "optima_trainers.backends",
    "Stage": "optima_trainers.stages",
    "StageData": "optima_trainers.stages",
    "StageOutcome": "optima_trainers.stages",
    "conversation_messages": "optima_trainers.sft_data",
    "tokenize_with_mask": "optima_trainers.sft_data",
    "DPOTrainConfig": "optima_trainers.dpo",
    "train_dpo": "optima_trainers.dpo",
    "build_trees": "optima_trainers.mcts",
    "estimate_token_normalizer": "optima_trainers.mcts_reward",
    "select_top_pairs": "optima_trainers.pairs",
    "write_pairs": "optima_trainers.types",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'optima_trainers' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
