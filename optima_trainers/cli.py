"""Command line of the trainers: ``python -m optima_trainers.train``.

Examples::

    python -m optima_trainers.train --task ie/synth-v0 --trainer isft --iterations 2
    python -m optima_trainers.train --task hotpotqa --trainer idpo --profile paper --backend vllm
    python -m optima_trainers.train --resume --run-dir runs/ie_synth-v0__isft__0__20250101-120000
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml -m optima_trainers.train ...

Values come from the task preset (``--preset code|paper``) sized by ``--profile cpu|paper``
(``auto``: ``paper`` with a GPU, else ``cpu``); every flag below overrides them, and ``--set
FIELD=VALUE`` reaches any field of :class:`optima_trainers.config.TrainConfig`. ``--resume``
continues a run from its folder with its stored configuration (only ``--iterations`` may change).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from typing import Any

from optima_env.errors import OptimaError, TaskContractError

__all__ = ["build_parser", "main", "resolve_from_args"]

logger = logging.getLogger("optima_trainers")

# flag -> TrainConfig field (flags whose value is given as is)
_FIELD_FLAGS: dict[str, tuple[str, type, str]] = {
    "--model": ("model", str, "starting model: embedded, a Hugging Face name or a local folder"),
    "--iterations": (
        "iterations",
        int,
        "isft: iterations incl. init; idpo: DPO iterations; isft-dpo: cycles",
    ),
    "--seed": ("seed", int, "seed of episodes, sampling and training"),
    "--backend": ("backend", str, "generation backend: hf or vllm"),
    "--instances": ("instances", int, "training instances per SFT iteration"),
    "--samples": ("num_samples", int, "conversations sampled per instance (N)"),
    "--max-turns": ("max_turns", int, "turns per conversation (and MCTS depth)"),
    "--max-new-tokens": ("max_new_tokens", int, "generation cap of one turn"),
    "--concurrency": ("concurrency", int, "conversations generated together (batch size)"),
    "--lr": ("sft_lr", float, "SFT learning rate"),
    "--epochs": ("sft_epochs", float, "SFT epochs per iteration"),
    "--batch-size": ("sft_batch_size", int, "effective SFT batch size"),
    "--max-steps": ("max_steps", int, "cap on optimizer steps per training stage"),
    "--theta-sft": ("theta_sft", float, "θ_sft: minimum total reward of a selected trajectory"),
    "--min-task-score": (
        "min_task_score",
        float,
        "select only among trajectories with at least this task score (not in the paper)",
    ),
    "--selection-order": ("selection_order", str, "code (top 70%% then θ) or paper (θ then 70%%)"),
    "--report-to": ("report_to", str, "none, tensorboard or wandb"),
    "--normalizer-instances": ("normalizer_instances", int, "instances setting the MCTS token normalizer"),
    "--mcts-instances": ("mcts_instances", int, "MCTS trees (instances) per DPO iteration"),
    "--readability-model": (
        "readability_model",
        str,
        "frozen model of the readability term (default: --model)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (``--help`` lists every option)."""
    parser = argparse.ArgumentParser(
        prog="python -m optima_trainers.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--task", default=None, help="task id or unique name (default: ie/synth-v0)")
    parser.add_argument("--trainer", default=None, help="isft (default), idpo or isft-dpo")
    parser.add_argument("--preset", choices=("code", "paper"), default="code", help="hyperparameter table")
    parser.add_argument("--profile", choices=("auto", "cpu", "paper"), default="auto", help="run sizes")
    for flag, (_, kind, text) in _FIELD_FLAGS.items():
        parser.add_argument(flag, type=kind, default=None, help=text)
    parser.add_argument("--full-finetune", action="store_true", help="full fine-tuning instead of LoRA")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override any TrainConfig field (JSON value)",
    )
    parser.add_argument(
        "--run-dir", default=None, help="run folder (default: runs/<task>__<trainer>__<seed>__<time>)"
    )
    parser.add_argument("--runs-root", default="runs", help="parent of new run folders (default: runs)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --run-dir (or the latest)")
    parser.add_argument("--data-dir", default=None, help="benchmark data folder (sets OPTIMA_DATA_DIR)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    return parser


def _overrides(ns: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flag, (field, _, _) in _FIELD_FLAGS.items():
        value = getattr(ns, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            out[field] = value
    if ns.full_finetune:
        out["lora"] = False
    for item in ns.set:
        key, sep, raw = item.partition("=")
        if not sep:
            raise TaskContractError(f"--set expects FIELD=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def _profile(name: str) -> str:
    if name != "auto":
        return name
    try:
        import torch

        return "paper" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def resolve_from_args(ns: argparse.Namespace, pm: Any) -> tuple[Any, Any]:
    """``(config, run_dir)`` from parsed arguments: a new run, or the stored one with ``--resume``."""
    from optima_env.registry import resolve_task_id, task_specs
    from optima_trainers.config import resolve_config
    from optima_trainers.runs import RunDir

    overrides = _overrides(ns)
    task = resolve_task_id(ns.task or "ie/synth-v0", pm)
    trainer = ns.trainer or "isft"
    if ns.resume:
        root = ns.run_dir or RunDir.latest(ns.runs_root, f"{task.replace('/', '_')}__{trainer}__")
        if root is None:
            raise TaskContractError(
                f"--resume found no run of {task} / {trainer} under {ns.runs_root}; give --run-dir"
            )
        run, stored = RunDir.open(root)
        if ns.task is not None:
            overrides["task"] = task
        if ns.trainer is not None:
            overrides["trainer"] = trainer
        conflicts = {
            k: (getattr(stored, k), v)
            for k, v in overrides.items()
            if k != "iterations" and getattr(stored, k, v) != v
        }
        if conflicts:
            raise TaskContractError(
                f"--resume keeps the run's stored config; these flags differ from it: {conflicts} "
                "(stored, given); drop them (only --iterations may change on resume)"
            )
        if "iterations" in overrides:
            stored = dataclasses.replace(stored, iterations=overrides["iterations"])
        return stored, run
    config = resolve_config(
        task,
        trainer,
        preset=ns.preset,
        profile=_profile(ns.profile),
        family=task_specs(pm)[task].family,
        **overrides,
    )
    if ns.print_config:
        return config, None
    return config, RunDir.create(config, run_dir=ns.run_dir, base=ns.runs_root)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 on a usage or data error)."""
    ns = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if ns.data_dir:
        os.environ["OPTIMA_DATA_DIR"] = ns.data_dir
    from optima_env.registry import get_plugin_manager, trainer_specs

    try:
        pm = get_plugin_manager()
        specs = trainer_specs(pm)
        if (ns.trainer or "isft") not in specs:
            raise TaskContractError(f"no trainer {ns.trainer!r}; registered: {', '.join(specs)}")
        config, run = resolve_from_args(ns, pm)
        if ns.print_config:
            print(json.dumps(config.to_dict(), indent=2))
            return 0
        logger.info("run folder: %s", run.root)
        trainer = specs[config.trainer].factory(config, run_dir=run, pm=pm, progress=not ns.no_progress)
        metrics = trainer.run()
    except OptimaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for record in metrics:
        keys = (
            "reward/total",
            "rollout/task_score",
            "rollout/tokens",
            "select/selected",
            "mcts/pairs",
            "train/loss",
        )
        shown = ", ".join(f"{k}={record[k]:.4g}" for k in keys if k in record)
        print(f"{record['stage']}: {shown}")
    print(f"run folder: {run.root}")
    return 0
