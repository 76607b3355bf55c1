"""optima_trainers: Optima's training variants (iSFT, iDPO, iSFT-DPO) on TRL and PEFT.

Public surface (importing this package does not import torch; training functions do)::

    from optima_trainers import resolve_config, RunDir, IterativeTrainer
    config = resolve_config("ie/synth-v0", "isft", profile="cpu", overrides={"reward.lambda_token": 0.4})
    IterativeTrainer(config, run_dir=RunDir.create(config)).run()

or, from a shell, ``python -m optima_trainers.train --task ie/synth-v0 --trainer isft``.

Everything the README and ``examples/`` import is an attribute of this package (``__all__``); most
load their module on first use. Adapters to other frameworks keep their own public namespace,
``optima_trainers.integrations.<framework>`` (e.g. ``integrations.trl`` for TRL's GRPO).

Subpackages are layers: each imports only the ones before it in this order (bottom first;
``tests/test_layers.py`` checks every import against it)::

    config → run → sft → dpo → tree → generation → integrations → backends → host → cli

* :mod:`optima_trainers.config`: the one configuration tree, its sections and presets;
* :mod:`optima_trainers.run`: what every stage shares (the run folder, stage and pair records,
  checkpoints and adapters, the LoRA export, the memory lifecycle and plan, TRL plumbing,
  tracking, provenance, fault points);
* :mod:`optima_trainers.sft`, :mod:`optima_trainers.dpo`, :mod:`optima_trainers.tree`: SFT
  (selection, masked data, TRL's SFTTrainer), DPO (pairs, TRL's DPOTrainer, its metrics) and the
  MCTS-style turn tree (nodes, search, scheduler, token normalizer);
* :mod:`optima_trainers.generation`: a stage's generation (policies and engines, the servers,
  sampled and tree stages, resumable rollouts and scoring, data-parallel shards);
* :mod:`optima_trainers.integrations`: adapters to other frameworks (TRL's GRPO);
* :mod:`optima_trainers.backends`: the backend contract and the built-in backends (iSFT, iDPO,
  iSFT-DPO, GRPO), registered as a third party's would be;
* :mod:`optima_trainers.host`: the host loop;
* :mod:`optima_trainers.cli`: the command lines (``train``, ``export``);
* :mod:`optima_trainers.hookspecs`: the training events (a module of the package root).
"""

from __future__ import annotations

from typing import Any

from optima_env.errors import CorruptCheckpointError
from optima_trainers.config.env import EnvSettings
from optima_trainers.config.train import GenerationConfig, TrainConfig, TreeSearchConfig, resolve_config
from optima_trainers.config.training import SelectionConfig
from optima_trainers.run.checkpoint import TrainResult
from optima_trainers.run.folder import RunDir
from optima_trainers.sft.selection import select_isft

__all__ = [
    "CorruptCheckpointError",
    "DPOTrainConfig",
    "EnvSettings",
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
    "IterativeTrainer": "optima_trainers.host.loop",
    "plan_stages": "optima_trainers.host.loop",
    "TrainerBackend": "optima_trainers.backends.contract",
    "StageContext": "optima_trainers.backends.contract",
    "ISFTBackend": "optima_trainers.backends.contract",
    "IDPOBackend": "optima_trainers.backends.contract",
    "ISFTDPOBackend": "optima_trainers.backends.contract",
    "sft_stages": "optima_trainers.backends.contract",
    "train_sft_stage": "optima_trainers.backends.contract",
    "Stage": "optima_trainers.run.stages",
    "StageData": "optima_trainers.run.stages",
    "StageOutcome": "optima_trainers.run.stages",
    "conversation_messages": "optima_trainers.sft.data",
    "tokenize_with_mask": "optima_trainers.sft.data",
    "DPOTrainConfig": "optima_trainers.dpo.trainer",
    "train_dpo": "optima_trainers.dpo.trainer",
    "build_trees": "optima_trainers.tree.search",
    "estimate_token_normalizer": "optima_trainers.tree.normalizer",
    "select_top_pairs": "optima_trainers.dpo.pairs",
    "write_pairs": "optima_trainers.run.records",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'optima_trainers' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
