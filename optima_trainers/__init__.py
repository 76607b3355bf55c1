"""optima_trainers: Optima's training variants (iSFT, iDPO, iSFT-DPO) on TRL and PEFT.

Public surface (importing this package does not import torch; training functions do)::

    from optima_trainers import resolve_config, RunDir, IterativeTrainer
    config = resolve_config("ie/synth-v0", "isft", profile="cpu", overrides={"reward.lambda_token": 0.4})
    IterativeTrainer(config, run_dir=RunDir.create(config)).run()

or, from a shell, ``python -m optima_trainers.train --task ie/synth-v0 --trainer isft``.

Modules: :mod:`~optima_trainers.config` (the configuration tree, profiles, resolution),
:mod:`~optima_trainers.backends` (the trainer-backend contract and the built-in backends),
:mod:`~optima_trainers.stages` (records the host and backends exchange),
:mod:`~optima_trainers.selection` (iSFT data selection), :mod:`~optima_trainers.sft_data` (per-agent
masked examples), :mod:`~optima_trainers.sft` (SFT on TRL), :mod:`~optima_trainers.mcts` /
:mod:`~optima_trainers.tree` / :mod:`~optima_trainers.pairs` / :mod:`~optima_trainers.dpo` (iDPO data
and training), :mod:`~optima_trainers.tree_stage` (tree-stage generation), :mod:`~optima_trainers.loop`
(the host loop), :mod:`~optima_trainers.runs` and :mod:`~optima_trainers.checkpoint` (persistence and
resume), :mod:`~optima_trainers.provenance` (the git commit a run records), :mod:`~optima_trainers.plugin`
(hook registrations), :mod:`~optima_trainers.cli` (command line).
"""

from __future__ import annotations

from typing import Any

from optima_trainers.checkpoint import TrainResult
from optima_trainers.config import GenerationConfig, TrainConfig, TreeSearchConfig, resolve_config
from optima_trainers.runs import RunDir
from optima_trainers.selection import SelectionConfig, select_isft

__all__ = [
    "GenerationConfig",
    "IterativeTrainer",
    "RunDir",
    "SelectionConfig",
    "Stage",
    "StageData",
    "StageOutcome",
    "TrainConfig",
    "TrainResult",
    "TrainerBackend",
    "TreeSearchConfig",
    "plan_stages",
    "resolve_config",
    "select_isft",
]

_LAZY = {
    "IterativeTrainer": "optima_trainers.loop",
    "plan_stages": "optima_trainers.loop",
    "TrainerBackend": "optima_trainers.backends",
    "Stage": "optima_trainers.stages",
    "StageData": "optima_trainers.stages",
    "StageOutcome": "optima_trainers.stages",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'optima_trainers' has no attribute {name!r}")
