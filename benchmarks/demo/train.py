"""The demo suite's training side: train (or resume) one Optima run of a demo task, export its
final model as the committed adapter (steps 1 and 2 of :mod:`benchmarks.demo.suite`), and keep the
task's training record.

The record (``<out>/<task>/training.json``, committed with the results) holds what the evaluation
and the report need of each run: its stages, their metrics and compute, its config, the unit key
of each stage's row and its adapter's digest.

The training folders are committed without each stage's merged weights and tokenizer file
(``.gitignore``): a LoRA stage keeps its adapter (about 19 MB in fp32 at r 16 on the embedded model,
against 540 MB merged), and a resumed run rebuilds the merged weights from it and copies the
tokenizer from the start model, each checked bit for bit against the stage's manifest
(:mod:`optima_trainers.run.adapters`). So a long retrain goes on across machines that
start empty, stage by stage. Once every run has finished, the record stands in for the training
folders (a task trained before they were committed has none; a committed one may leave out some
stages' adapters to keep a submission small): :func:`recorded_runs` gives the runs back from the
record when it still agrees with the recipe and the committed adapters, and the demo then trains
nothing again as long as every stage's episodes are in the committed store
(:mod:`benchmarks.demo.suite` checks that).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.demo.tasks import DemoTask
from optima_env.backends.peft_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS, verify_manifest
from optima_env.errors import DataError
from optima_env.io import read_json_object, write_json_atomic

__all__ = [
    "TrainedRun",
    "adapter_dir",
    "chain_rank",
    "export_run",
    "init_done",
    "init_result",
    "record_training",
    "recorded_runs",
    "train_run",
]

_RECORD = "training.json"
"""A task's training record, in ``<out>/<task>/`` (see the module docstring)."""


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
    keys: Mapping[str, str] = field(default_factory=dict)
    """The unit key of each own stage's row, for a run read from the training record (its
    checkpoints are gone); empty for a run trained here, whose keys are its checkpoints' hashes."""

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


def _plain(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), for comparing with a record."""
    return json.loads(json.dumps(value))


def _config(spec: DemoTask, trainer: str) -> Any:
    from optima_trainers.config.train import resolve_config

    return resolve_config(
        spec.task,
        trainer,
        task_kwargs=dict(spec.task_kwargs),
        model=spec.model,
        overrides=spec.config_overrides(trainer),
    )


def _same_init(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two runs' configs give the same initialization stage (all but the trainer's own parts)."""
    own = ("trainer", "iterations", "options", "tree", "dpo")
    return {k: v for k, v in a.items() if k not in own} == {k: v for k, v in b.items() if k not in own}


def _init_source(
    spec: DemoTask, root: Path, trainer: str, config: Mapping[str, Any]
) -> tuple[Path, str] | None:
    """Another of the task's runs (in the demo's order) whose initialization stage finished on its
    own (not adopted) with the same settings as ``config``'s: ``(its folder, that stage's name)``,
    or None."""
    for other in spec.trainers:
        source, init = root / "train" / other, _init_stage(spec, other)
        if (
            other != trainer
            and init is not None
            and init_done(spec, root, other)
            and not (source / init / "adopted.json").is_file()
            and _same_init(read_json_object(source / "config.json"), _plain(config))
        ):
            return source, init
    return None


def _init_stage(spec: DemoTask, trainer: str) -> str | None:
    """The name of ``trainer``'s initialization stage on the task (None: its run has none)."""
    from optima_trainers.host.loop import plan_stages

    first = plan_stages(_config(spec, trainer))[0]
    return first.name if first.init else None


def init_result(spec: DemoTask, root: Path, trainer: str) -> Path | None:
    """The record that ``trainer``'s run of the task writes when its initialization stage (M_0)
    is finished (None: the run has no initialization stage)."""
    init = _init_stage(spec, trainer)
    return None if init is None else root / "train" / trainer / init / "result.json"


def init_done(spec: DemoTask, root: Path, trainer: str) -> bool:
    """Whether ``trainer``'s run of the task has finished its initialization stage (M_0)."""
    result = init_result(spec, root, trainer)
    return result is not None and result.is_file()


def train_run(spec: DemoTask, root: Path, trainer: str, *, progress: bool) -> TrainedRun:
    """Train (or resume) one run in ``root/train/<trainer>``. Its initialization (M_0) is adopted
    from another of the task's runs that trained it with the same settings, whichever trained it
    first; finished stages whose merged weights are missing (a committed folder keeps only their
    adapters) are rebuilt by the run (:mod:`optima_trainers.run.adapters`)."""
    from optima_trainers.host.loop import IterativeTrainer, plan_stages
    from optima_trainers.run.folder import RunDir, read_stage_result

    folder = root / "train" / trainer
    config = _config(spec, trainer)
    run_dir = RunDir.open_or_create(config, folder)
    stages = plan_stages(config)
    init = stages[0]
    source = _init_source(spec, root, trainer, config.to_dict()) if init.init else None
    if source is not None and not (folder / init.name / "result.json").is_file():
        run_dir.adopt_stage(init.name, RunDir.open(source[0])[0], source[1])
    shared = next((s.name for s in stages if run_dir.adopted_from(s.name)), None)
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


def chain_rank(run: TrainedRun) -> int:
    """The rank of a run's final weight change: the sum of the LoRA ranks ``r`` of the stages it
    chains (each stage's adapter, ``checkpoint/adapter/``, merged into the one before it; a stage
    that trained nothing and kept its start model is counted once). A truncated SVD at this rank
    carries the final model exactly (up to the adapter's dtype); a lower rank drops part of what
    training changed (rank 8 of a 4-stage r-16 chain lost about a third of the change).

    Raises:
        DataError: a stage's checkpoint has no adapter config to read ``r`` from (a stage trained
            in full, or a folder from before stages kept their adapters); set the task's
            ``adapter_rank`` instead.
    """
    from optima_trainers.run.adapters import ADAPTER_FOLDER

    total = 0
    for stage, checkpoint in _distinct(run.stages):
        config = Path(checkpoint) / ADAPTER_FOLDER / ADAPTER_CONFIG
        if not config.is_file():
            raise DataError(
                f"{run.trainer} {stage}: expected the stage's LoRA adapter config at {config}, found none "
                "(a full fine-tune or a folder from before stages kept adapters); set the demo task's "
                "adapter_rank to export at a fixed rank"
            )
        rank = read_json_object(config, fix="delete the stage folder and resume the run").get("r")
        if not isinstance(rank, int) or rank < 1:
            raise DataError(f"{config}: field 'r': expected an int >= 1, got {rank!r}")
        total += rank
    return total


def _distinct(stages: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The stages with their own checkpoint folder (the first stage naming each folder)."""
    seen: set[str] = set()
    out = []
    for stage, checkpoint in stages:
        key = os.path.realpath(checkpoint)
        if key not in seen:
            seen.add(key)
            out.append((stage, checkpoint))
    return out


def export_run(
    spec: DemoTask, out: Path, run: TrainedRun, *, command: str, git_commit: str
) -> dict[str, Any]:
    """Export the run's final model as the committed adapter, at the task's ``adapter_rank`` or,
    unset, at :func:`chain_rank` (exact)."""
    from optima_trainers.run.export import export_lora

    stage, checkpoint = run.stages[-1]
    return export_lora(
        spec.model,
        checkpoint,
        adapter_dir(out, spec.name, run.trainer),
        rank=spec.adapter_rank if spec.adapter_rank is not None else chain_rank(run),
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


def record_training(
    root: Path,
    runs: Sequence[TrainedRun],
    keys: Mapping[str, Mapping[str, str]],
    exports: Mapping[str, Mapping[str, Any]],
) -> None:
    """Write the task's training record (``root/training.json``; unchanged content is not rewritten).

    ``keys`` maps each trainer to the unit keys of its own stages' rows, ``exports`` each trainer
    to its adapter's manifest."""
    record = _plain(
        {
            "runs": [
                {
                    "trainer": run.trainer,
                    # the checkpoints' paths as the rows name them (relative to the task's folder)
                    "stages": [[stage, os.path.relpath(path, root)] for stage, path in run.stages],
                    "shared": run.shared,
                    "keys": dict(keys[run.trainer]),
                    "adapter": exports[run.trainer]["files"][ADAPTER_WEIGHTS],
                    "config": dict(run.config),
                    "metrics": list(run.metrics),
                }
                for run in runs
            ]
        }
    )
    path = root / _RECORD
    if not path.is_file() or read_json_object(path) != record:
        write_json_atomic(path, record)


def _with_engine(config: Any) -> Any:
    """A recorded run's config with its generation engine: a record written before configs held
    one (no ``generation.precision``) was generated by the fp32 ``multinomial`` engine
    (:data:`~optima_env.backends.precision.LEGACY_ENGINE`), so it matches only a recipe on that engine."""
    from optima_env.backends.precision import LEGACY_ENGINE

    generation = config.get("generation") if isinstance(config, dict) else None
    if not isinstance(generation, dict) or "precision" in generation:
        return config
    return {**config, "generation": {**generation, **LEGACY_ENGINE}}


def recorded_runs(spec: DemoTask, root: Path, out: Path) -> list[TrainedRun] | None:
    """The task's runs as its training record holds them, when the record agrees with the recipe
    (every trainer's config, so the same number of iterations: the record is written once every
    run has finished them) and with the committed adapters (their weights' sha256); else None, and
    the demo trains. The training folders, if any, are not read: a committed folder has no merged
    weights, and the stages whose adapters were left out (too large to commit) cannot rebuild them.

    Raises:
        DataError: a committed adapter's files do not match its manifest (from
            :func:`~optima_env.backends.peft_adapter.verify_manifest`).
    """
    path = root / _RECORD
    if not path.is_file():
        return None
    by_trainer = {r.get("trainer"): r for r in read_json_object(path).get("runs", [])}
    runs = []
    for trainer in spec.trainers:
        record = by_trainer.get(trainer)
        if record is None or _with_engine(record.get("config")) != _plain(_config(spec, trainer).to_dict()):
            return None
        manifest = verify_manifest(adapter_dir(out, spec.name, trainer))
        if manifest is None or manifest["files"].get(ADAPTER_WEIGHTS) != record.get("adapter"):
            return None
        runs.append(  # its checkpoints are gone: the rows keep the record's keys
            TrainedRun(
                trainer=trainer,
                # absolute, as a run folder names its checkpoints (RunDir.model_path)
                stages=tuple((stage, str((root / path).absolute())) for stage, path in record["stages"]),
                metrics=tuple(record["metrics"]),
                shared=record["shared"],
                config=record["config"],
                keys=dict(record["keys"]),
            )
        )
    return runs
