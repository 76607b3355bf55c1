"""The demo suite: Optima's Table 1 on 2 CPU cores (``python -m benchmarks.run --suite demo``).

For each demo task (:data:`benchmarks.demo.tasks.DEMO_TASKS`: the embedded synthetic task at a
setting where no agent can answer alone, then HotpotQA when its data is present):

0. **baselines**: the untrained CoT, SC, MAD and AutoForm on the held-out instances, before any
   training (``<out>/<task>/baselines/``, their episodes in the table's store): they do not depend
   on training, so they are played once, and a setting where MAD scores near zero shows early.
1. **train** iSFT, iDPO and iSFT-DPO with the embedded model (SmolLM2-135M-Instruct; LoRA, fp32,
   the trainers' cpu profile plus the task's overrides), each in ``<out>/<task>/train/<trainer>``.
   The initialization (M_0, spec §4) has the same settings for the three, so it is trained once,
   by the first run that reaches it, and copied into the others (hard links; counted once in the
   compute; the table's M_0 row is that run's iteration-0 stage). A rerun
   with the same ``--out`` resumes every run where it stopped (finished stages are kept; only the
   number of iterations may change).
2. **export** each run's final model as a LoRA adapter (``<out>/adapters/<task>/<trainer>``:
   fp16, at the task's ``adapter_rank`` or the chain's full rank, with a manifest of the command,
   git commit, config, sha256 and the truncation's error;
   :func:`optima_trainers.run.export.export_lora`); these are the committed adapters that the
   README's main command evaluates.
3. **evaluate** on held-out instances (the test split; HotpotQA's is the dev set), greedy, with the
   same caps for every system: every stage of every run on the first ``stage_instances``, beside
   MAD and CoT (the curves; first, since only they need the training folders), then the table
   (the baselines, resumed from step 0, and each run's exported adapter) on all
   ``eval_instances``, then the inference-scaling curves of MAD and the best trained system. The
   episodes go to ``<out>/<task>/eval/`` (the stages' too; resumable), the stages' and the
   scaling results to ``stages/`` and ``scaling/``.
4. **report**: ``report.md`` (Table-1-style, 95% bootstrap intervals on every score and ratio,
   per-iteration curves, the recipe's departures from the spec, the compute summed over every
   invocation), ``demo.json`` and the plots; with ``--update-readme`` the README's demo block.

What a fresh clone resumes: the episode stores, their ``timing.json``, ``invocations.json``, the
adapters, each task's training record (``<task>/training.json``: :mod:`benchmarks.demo.train`)
and the training folders but for their merged weights (each stage keeps its LoRA adapter, from
which a resumed run rebuilds them) are committed with the results (see ``.gitignore``). Once the
runs have finished, a clone takes them from the record, so long as it agrees with the recipe and
the committed adapters and every stage's episodes are in the store, and trains nothing; otherwise
it trains again (resuming the training folders). To reproduce the adapters from scratch, pass
another ``--out``.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.demo.clock import InvocationClock
from benchmarks.demo.control import control_label
from benchmarks.demo.plots import write_plots
from benchmarks.demo.report import readme_block, summarize, write_pages
from benchmarks.demo.tasks import (
    DEMO_ENGINE,
    DEMO_SUITE,
    DEMO_TASKS,
    DemoTask,
    eval_settings,
    stage_label,
    trainer_label,
)
from benchmarks.demo.train import (
    TrainedRun,
    adapter_dir,
    export_run,
    record_training,
    recorded_runs,
    train_run,
)
from benchmarks.evaluation.controls import add_controls, task_ceiling
from benchmarks.evaluation.methods import Method, PlaySettings, build_methods, counterfactual
from benchmarks.evaluation.outputs import collect_results, write_outputs, write_viewer, written_results
from benchmarks.evaluation.store import EpisodeStore
from benchmarks.evaluation.units import TaskEntry, open_task, pending_jobs, play_methods
from optima_env import make_task
from optima_env.backends.peft_adapter import ADAPTER_WEIGHTS, verify_manifest
from optima_env.errors import DataError, MissingDependencyError, TaskContractError
from optima_env.io import read_json_object, write_json_atomic

__all__ = ["TrainedRun", "adapter_dir", "adapter_label", "play_folder", "row_labels", "run_demo"]

logger = logging.getLogger("benchmarks.demo.suite")


def row_labels(runs: Sequence[TrainedRun]) -> dict[tuple[str, str], str]:
    """The evaluated row of every (trainer, stage): its own, or M_0's row for a shared M_0 (the row
    of the run that trained it)."""
    labels: dict[tuple[str, str], str] = {}
    control = control_label(runs)
    for run in runs:
        for stage, _ in run.stages:
            if stage == run.shared and control is not None:
                labels[run.trainer, stage] = control
            else:
                labels[run.trainer, stage] = stage_label(run.trainer, stage)
    return labels


def adapter_label(trainer: str, manifest: Mapping[str, Any]) -> str:
    """The row of a run's exported adapter: its trainer, rank and weights' digest (so a re-export
    with other weights is a new row, never the old row's episodes)."""
    digest = str(manifest.get("files", {}).get(ADAPTER_WEIGHTS, ""))[:8]
    return f"{trainer_label(trainer)} adapter (r{manifest.get('rank')}, {digest})"


def _adapter_rows(
    spec: DemoTask, out: Path, runs: Sequence[TrainedRun], exports: Mapping[str, Mapping[str, Any]]
) -> dict[str, str]:
    """Each run's exported adapter (what is committed is what is scored), by row label."""
    return {
        adapter_label(run.trainer, exports[run.trainer]): str(adapter_dir(out, spec.name, run.trainer))
        for run in runs
    }


def _stage_methods(runs: Sequence[TrainedRun], settings: PlaySettings) -> list[Method]:
    """MAD, CoT and every stage of every run (a shared M_0 once, through its full checkpoint); the
    rows of a run read from the training record keep its recorded keys (its checkpoints are gone)."""
    rows = {stage_label(r.trainer, s): path for r in runs for s, path in r.stages if s != r.shared}
    keys = {stage_label(r.trainer, s): key for r in runs for s, key in r.keys.items()}
    return build_methods(("mad", "cot"), rows, settings, keys=keys)


def _stage_keys(runs: Sequence[TrainedRun], settings: PlaySettings) -> dict[str, dict[str, str]]:
    """The unit key of every own stage's row, by trainer and stage (for the training record)."""
    keys = {m.label: m.key for m in _stage_methods(runs, settings)}
    return {
        r.trainer: {s: keys[stage_label(r.trainer, s)] for s, _ in r.stages if s != r.shared} for r in runs
    }


def _entry(spec: DemoTask, instances: int) -> TaskEntry:
    """The first ``instances`` held-out instances of the task."""
    return open_task(
        (spec.task,), explicit=True, suite=DEMO_SUITE, split=spec.eval_split,
        episodes=instances, pm=None, task_kwargs=spec.task_kwargs,
    )  # fmt: skip


def _unplayed(spec: DemoTask, root: Path, runs: Sequence[TrainedRun]) -> list[str]:
    """The stage rows whose episodes the table's store lacks on the stages' instances."""
    settings, entry = eval_settings(spec), _entry(spec, spec.stage_instances)
    store = EpisodeStore(_table_store(root))
    own = {stage_label(r.trainer, s) for r in runs for s in r.keys}
    return [
        m.label
        for m in _stage_methods(runs, settings)
        if m.label in own and pending_jobs(m, entry, store, seed=settings.seed)
    ]


def _recorded(
    spec: DemoTask, root: Path, out: Path
) -> tuple[list[TrainedRun], dict[str, dict[str, Any]]] | None:
    """The runs and exports of the training record, when the demo can take them instead of
    training (see the module docstring); None when it must train."""
    runs = recorded_runs(spec, root, out)
    if not runs:
        return None
    missing = _unplayed(spec, root, runs)
    if missing:
        logger.warning(
            "demo %s: the training record's stages %s have no episodes in the store and their "
            "checkpoints are gone: training again", spec.name, ", ".join(missing),
        )  # fmt: skip
        return None
    exports = {}
    for run in runs:
        folder = adapter_dir(out, spec.name, run.trainer)
        exports[run.trainer] = {**(verify_manifest(folder) or {}), "folder": str(folder)}
    return runs, exports


def _control_method(
    spec: DemoTask, root: Path, runs: Sequence[TrainedRun], settings: PlaySettings
) -> Method | None:
    """M_0's row for the table (:mod:`benchmarks.demo.control`): its stage row, the same unit key,
    so its episodes on the stages' instances are reused; None when it cannot be played (its
    checkpoint is gone, as in a run taken from the training record, and the store lacks some of its
    table episodes): the report then says M_0 is missing from the table."""
    label = control_label(runs)
    method = next((m for m in _stage_methods(runs, settings) if m.label == label), None)
    if method is None:
        return None
    store, entry = EpisodeStore(_table_store(root)), _entry(spec, spec.eval_instances)
    if _loadable(str(method.model)) or not pending_jobs(method, entry, store, seed=settings.seed):
        return method
    logger.warning("demo %s: %s's checkpoint is gone and its table episodes are not all played: "
                   "the table has no M_0 row", spec.name, label)  # fmt: skip
    return None


def _loadable(checkpoint: str) -> bool:
    """Whether a stage's checkpoint folder holds its weights (a committed one keeps only its
    manifest, and some stages their adapter)."""
    from optima_trainers.run.adapters import missing_files

    return Path(checkpoint).is_dir() and not missing_files(checkpoint)


def _timing(folder: Path) -> tuple[Path, float]:
    folder.mkdir(parents=True, exist_ok=True)
    timing = folder / "timing.json"  # generation seconds of this folder's rows, summed over invocations
    return timing, float(read_json_object(timing)["generate_s"]) if timing.is_file() else 0.0


def play_folder(
    spec: DemoTask,
    folder: Path,
    methods: Sequence[Any],
    settings: PlaySettings,
    instances: int,
    *,
    concurrency: int,
    provenance: Mapping[str, Any],
    episodes: Path | None = None,
) -> dict[str, Any]:
    """Play ``methods`` on the first ``instances`` held-out instances and write their results into
    ``folder`` (resumable); the episodes go to ``episodes`` (default: the folder's own store)."""
    timing, spent = _timing(folder)
    store = EpisodeStore(episodes or folder / "episodes.jsonl")
    entry = _entry(spec, instances)
    resumed, started, wall_started = len(store), time.perf_counter(), time.time()
    play_methods(
        methods, [entry], store, settings=settings, split=spec.eval_split, concurrency=concurrency,
        backend="hf", default_model=spec.model, policy_options=DEMO_ENGINE,
    )  # fmt: skip
    if len(store) > resumed or not timing.is_file():
        spent += time.perf_counter() - started
        write_json_atomic(timing, {"generate_s": round(spent, 1)})
    results = collect_results([entry], methods, store)
    add_controls(results, [entry])
    kept = written_results(folder, results) if len(store) == resumed else None
    if kept is not None:  # a rerun with nothing to play keeps the outputs of the run that played
        write_viewer(folder, kept, store, viewer_limit=10)  # the page is not committed: written again
        return kept
    results.update(
        provenance,
        run_name=f"demo/{spec.name}/{folder.name}",
        suite="demo",
        model=spec.model,
        backend="hf",
        token_counter="the tokenizer of the model that played (len(tokenizer.tokenize(turn text)))",
        data_dir=os.environ.get("OPTIMA_DATA_DIR"),
        split=spec.eval_split,
        settings={k: getattr(settings, k) for k in settings.__dataclass_fields__},
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(wall_started)),
        units={"generated": len(store) - resumed, "resumed": resumed},
        wall_time_s=round(time.perf_counter() - started, 1),
        eval_generate_s=round(spent, 1),
    )
    write_outputs(folder, results, store, viewer_limit=10, episodes=os.path.relpath(store.path, folder))
    return results


def _table_store(root: Path) -> Path:
    """The episode store of a task's table, shared by the baselines' pass and the stages' curves."""
    return root / "eval" / "episodes.jsonl"


def _baselines(
    spec: DemoTask, root: Path, *, concurrency: int, provenance: Mapping[str, Any]
) -> dict[str, Any]:
    """The untrained baselines on the table's instances, played before any training: their episodes
    go to the table's store (the evaluation resumes them), and a setting where MAD scores near zero
    shows in ``baselines/report.md`` before hours of training are spent on it."""
    settings = eval_settings(spec)
    methods = build_methods(spec.baselines, {}, settings)
    logger.info("demo %s: the untrained baselines on %d held-out instances", spec.name, spec.eval_instances)
    return play_folder(
        spec, root / "baselines", methods, settings, spec.eval_instances, concurrency=concurrency,
        provenance=provenance, episodes=_table_store(root),
    )  # fmt: skip


def _evaluate(
    spec: DemoTask,
    root: Path,
    out: Path,
    runs: Sequence[TrainedRun],
    *,
    concurrency: int,
    provenance: Mapping[str, Any],
    exports: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    settings = eval_settings(spec)
    play = functools.partial(play_folder, spec, concurrency=concurrency, provenance=provenance)
    # every stage first, on the first instances of the table's store (MAD's and CoT's are played
    # already): the stages need the training folders, which a new checkout lacks, and the table
    # only the committed adapters, so a stop after this point never trains again
    logger.info("demo %s: every training stage on %d held-out instances", spec.name, spec.stage_instances)
    stages = play(
        root / "stages", _stage_methods(runs, settings), settings, spec.stage_instances,
        episodes=_table_store(root),
    )  # fmt: skip
    adapters = _adapter_rows(spec, out, runs, exports)
    methods = build_methods(spec.baselines, adapters, settings)
    if spec.controls:  # each trained system again with its first agent's evidence swapped
        methods += [counterfactual(m) for m in methods if m.model is not None]
    control = _control_method(spec, root, runs, settings)
    if control is not None:  # M_0 beside the baselines, before the trained systems
        methods.insert(len(spec.baselines), control)
    logger.info("demo %s: %d systems on %d held-out instances", spec.name, len(methods), spec.eval_instances)
    main = play(root / "eval", methods, settings, spec.eval_instances)
    if spec.scaling_instances <= 0 or not runs:
        return main, stages, None
    finals = {trainer_label(r.trainer): adapter_label(r.trainer, exports[r.trainer]) for r in runs}
    scores = {r["method"]: r["score"] for r in main["rows"] if r["score"] is not None}
    best = max(finals, key=lambda t: scores.get(finals[t], -1.0))
    scaling = build_methods(("mad",), {finals[best]: adapters[finals[best]]}, settings, scaling=True)
    logger.info("demo %s: inference scaling of MAD and %s (k=%d)", spec.name, best, spec.scaling_k)
    curves = play(root / "scaling", scaling, settings, spec.scaling_instances)
    return main, stages, curves


# size: the demo command's options, forwarded from its CLI
def run_demo(
    out: Path,
    *,
    names: Sequence[str] = (),
    tasks: Sequence[DemoTask] = DEMO_TASKS,
    concurrency: int = 32,
    update_readme_path: Path | None = None,
    command: str = "python -m benchmarks.run --suite demo",
    demo_command: str | None = None,
    git_commit: str = "",
    threads: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train, export and evaluate every demo task (or those in ``names``); write the report and plots.

    ``command`` is this invocation's (the adapters' manifests name it); ``demo_command``, the one
    that reproduces the whole report (every task, where ``names`` picks some; default: ``command``)."""
    specs = [s for s in tasks if not names or s.name in names or s.task in names]
    if not specs:
        raise TaskContractError(
            f"no demo task named {', '.join(names)}; expected one of {', '.join(s.name for s in tasks)}"
        )
    out.mkdir(parents=True, exist_ok=True)
    with InvocationClock(out / "invocations.json"):
        return _run(
            out, specs, tasks, concurrency, update_readme_path, command, demo_command or command,
            git_commit, threads, progress,
        )  # fmt: skip


def _published(out: Path, tasks: Sequence[DemoTask], specs: Sequence[DemoTask]) -> list[dict[str, Any]]:
    """The summaries ``demo.json`` holds of the demo tasks this invocation does not run (``--task``
    picks some), kept as published, so that one task's run does not drop the other's table."""
    path = out / "demo.json"
    others = {s.task for s in tasks} - {s.task for s in specs}
    if not others or not path.is_file():
        return []
    return [t for t in read_json_object(path).get("tasks", []) if t.get("task") in others]


# size: the demo's phases in order (baselines, training, stages, table, report), each a call
def _run(
    out: Path,
    specs: Sequence[DemoTask],
    tasks: Sequence[DemoTask],
    concurrency: int,
    update_readme_path: Path | None,
    command: str,
    demo_command: str,
    git_commit: str,
    threads: int | None,
    progress: bool,
) -> dict[str, Any]:
    started = time.time()
    provenance = {"git_commit": git_commit, "command": command.split()}
    summaries: list[dict[str, Any]] = []
    units = sum(len(s.trainers) + 2 for s in specs)
    kept, order = _published(out, tasks, specs), [s.task for s in tasks]
    done = 0

    def publish(pending: Sequence[DemoTask]) -> dict[str, Any]:
        """demo.json, report.md and (with ``update_readme_path``) the README block, so far."""
        shown = sorted([*kept, *summaries], key=lambda t: order.index(t["task"]))  # the demo's order
        demo = write_pages(
            out, shown, command=demo_command, git_commit=git_commit, started=started, threads=threads,
            pending=[s.task for s in pending], invocation_command=command,
        )  # fmt: skip
        if update_readme_path is not None:
            from benchmarks.reports.readme import replace_block

            replace_block(update_readme_path, "demo", readme_block(demo))
        return demo

    for i, spec in enumerate(specs):
        root = out / spec.name
        try:
            make_task(spec.task, **dict(spec.task_kwargs)).samples("train")[0]
        except (DataError, MissingDependencyError) as exc:
            logger.warning("demo task %s skipped: %s", spec.task, exc)
            entry = TaskEntry(task=spec.task)
            entry.miss(exc)
            summaries.append(summarize(spec, None, None, [], {}, status=(entry.status, entry.reason)))
            done += len(spec.trainers) + 2
            demo = publish(specs[i + 1 :])
            continue
        done += 1
        print(f"[demo {done}/{units}] {spec.name}: evaluating the untrained baselines", flush=True)
        baselines = _baselines(spec, root, concurrency=concurrency, provenance=provenance)
        recorded = _recorded(spec, root, out)
        if recorded is not None:
            runs, exports = recorded
            done += len(spec.trainers)
            print(
                f"[demo {done}/{units}] {spec.name}: the training record and the committed adapters "
                "(every run finished, every stage played): not training again (another --out trains "
                "from scratch)", flush=True,
            )  # fmt: skip
        else:
            runs, exports = [], {}
            for trainer in spec.trainers:
                done += 1
                print(f"[demo {done}/{units}] {spec.name}: training {trainer_label(trainer)}", flush=True)
                run = train_run(spec, root, trainer, progress=progress)
                runs.append(run)
                manifest = export_run(spec, out, run, command=command, git_commit=git_commit)
                exports[trainer] = {**manifest, "folder": str(adapter_dir(out, spec.name, trainer))}
            record_training(root, runs, _stage_keys(runs, eval_settings(spec)), exports)
        done += 1
        print(f"[demo {done}/{units}] {spec.name}: evaluating", flush=True)
        main, stages, curves = _evaluate(
            spec, root, out, runs, concurrency=concurrency, provenance=provenance, exports=exports
        )
        finals = {adapter_label(r.trainer, exports[r.trainer]): trainer_label(r.trainer) for r in runs}
        summary = summarize(
            spec, main, curves, runs, exports, stages=stages, labels=row_labels(runs), finals=finals,
            baselines=baselines, control=control_label(runs),
            ceiling=task_ceiling(make_task(spec.task, **dict(spec.task_kwargs))) if spec.controls else None,
        )  # fmt: skip
        summary["plots"] = write_plots(summary, out)
        summaries.append(summary)
        demo = publish(specs[i + 1 :])
    print((out / "report.md").read_text(encoding="utf-8"))  # as write_pages wrote it
    return demo
