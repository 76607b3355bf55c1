"""The demo suite's training side: train (or resume) one Optima run of a demo task and export its
final model as the committed adapter (steps 1 and 2 of :mod:`benchmarks.demo`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.demo_tasks import DemoTask
from optima_env.errors import TaskContractError
from optima_env.io import read_json_object, write_json_atomic

__all__ = ["TrainedRun", "adapter_dir", "export_run", "train_run"]

_SHARED = "shared_init.json"
"""Marker in a run folder whose initialization stage was copied from the iSFT run."""


@dataclass(frozen=True)
class TrainedRun:
    """One finished training run of the demo."""

    trainer: str
    stages: tuple[tuple[str, str], ...]
    """``(stage name, checkpoint folder)`` in order."""
    metrics: tuple[Mapping[str, Any], ...]
    """The run's per-stage metrics (``metrics.jsonl``)."""
    shared: str | None
    """The stage copied from the iSFT run (its compute is counted there), if any."""
    config: Mapping[str, Any]
    """The run's configuration (``config.json``)."""

    def compute_s(self) -> float:
        """Seconds of the stages this run computed itself (summed over invocations)."""
        return sum(
            v
            for m in self.metrics
            if m.get("stage") != self.shared
            for k, v in m.items()
            if k.startswith("time/")
        )


def adapter_dir(out: Path, task: str, trainer: str) -> Path:
    """Where the demo writes (and the main command reads) the adapter of ``trainer`` on ``task``."""
    return out / "adapters" / task / trainer


def _config(spec: DemoTask, trainer: str) -> Any:
    from optima_trainers.config import resolve_config

    return resolve_config(
        spec.task,
        trainer,
        task_kwargs=dict(spec.task_kwargs),
        model=spec.model,
        overrides=spec.config_overrides(trainer),
    )


def _open_run(spec: DemoTask, trainer: str, folder: Path) -> tuple[Any, Any]:
    from optima_trainers.runs import RunDir

    config = _config(spec, trainer)
    if not (folder / "config.json").is_file():
        return RunDir.create(config, run_dir=folder), config
    run_dir, stored = RunDir.open(folder)
    now = config.to_dict()
    differ = {
        k: (v, now.get(k)) for k, v in stored.to_dict().items() if k != "iterations" and now.get(k) != v
    }
    if differ:
        raise TaskContractError(
            f"{folder} holds a {trainer} run with other settings than the demo's {spec.name!r} task "
            f"(stored, now): {differ}; only the number of iterations may change on resume: "
            "use another --out or delete the folder"
        )
    return run_dir, config


def _same_init(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two runs' configs give the same initialization stage (all but the trainer's own parts)."""
    own = ("trainer", "iterations", "options", "tree", "dpo")
    return {k: v for k, v in a.items() if k not in own} == {k: v for k, v in b.items() if k not in own}


def _share_init(source: Path, source_stage: str, run_dir: Any, stage: str) -> None:
    """Copy the finished initialization ``source/source_stage`` into ``run_dir`` as ``stage``
    (hard links; written under a temporary name and renamed, so a crash leaves no half stage)."""
    from optima_trainers.runs import read_stage_result

    target = run_dir.root / stage
    tmp = run_dir.root / f".{stage}.sharing"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source / source_stage, tmp, copy_function=os.link)
    record = read_stage_result(tmp / "result.json")
    if record["model"].startswith(f"{source_stage}/"):
        record["model"] = stage + record["model"][len(source_stage) :]
    write_json_atomic(tmp / "result.json", record)
    # the marker first: a crash before the rename leaves no finished stage, so it is copied again
    write_json_atomic(run_dir.root / _SHARED, {"stage": stage, "from": str(source / source_stage)})
    shutil.rmtree(target, ignore_errors=True)  # an unfinished stage of its own, never a finished one
    tmp.rename(target)


def train_run(
    spec: DemoTask, root: Path, trainer: str, first: TrainedRun | None, *, progress: bool
) -> TrainedRun:
    """Train (or resume) one run in ``root/train/<trainer>``; its initialization is copied from
    ``first`` when they agree."""
    from optima_trainers.loop import IterativeTrainer, plan_stages
    from optima_trainers.runs import read_stage_result

    folder = root / "train" / trainer
    run_dir, config = _open_run(spec, trainer, folder)
    stages = plan_stages(config)
    init = stages[0]
    marker = folder / _SHARED
    if (
        first is not None
        and init.init
        and not (folder / init.name / "result.json").is_file()
        and _same_init(first.config, config.to_dict())
    ):
        source = root / "train" / first.trainer
        _share_init(source, first.stages[0][0], run_dir, init.name)
    shared = read_json_object(marker)["stage"] if marker.is_file() else None
    metrics = IterativeTrainer(config, run_dir=run_dir, progress=progress).run()
    done = []
    for stage in stages:
        record = read_stage_result(folder / stage.name / "result.json")
        done.append((stage.name, str(run_dir.model_path(record["model"]))))
    return TrainedRun(
        trainer=trainer,
        stages=tuple(done),
        metrics=tuple(metrics),
        shared=shared,
        config=config.to_dict(),
    )


def export_run(
    spec: DemoTask, out: Path, run: TrainedRun, *, command: str, git_commit: str
) -> dict[str, Any]:
    from optima_trainers.export import export_lora

    stage, checkpoint = run.stages[-1]
    return export_lora(
        spec.model,
        checkpoint,
        adapter_dir(out, spec.name, run.trainer),
        rank=spec.adapter_rank,
        provenance={
            "command": command,
            "git_commit": git_commit,
            "task": spec.task,
            "task_kwargs": dict(spec.task_kwargs),
            "trainer": run.trainer,
            "stage": stage,
            "config": dict(run.config),
        },
    )
