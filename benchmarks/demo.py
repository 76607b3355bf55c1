"""The demo suite: Optima's effect end to end on 2 CPU cores (``python -m benchmarks.run --suite demo``).

For each demo task (:data:`DEMO_TASKS`: the embedded synthetic task, then real HotpotQA when its
data is present):

1. **train**: iSFT with the embedded model (SmolLM2-135M-Instruct; LoRA, fp32, the trainers' cpu
   profile plus the overrides of the task's :class:`DemoTask`), in ``<out>/<task>/train``; a rerun
   with the same ``--out`` resumes it (finished stages are kept);
2. **evaluate** on held-out instances (the test split: HotpotQA's is the dev set), greedy, with the
   turn and token caps of training: the untrained 2-agent system, single-agent CoT with the
   untrained model, and the 2-agent system with the checkpoint of every iteration; episodes go to
   ``<out>/<task>/eval/episodes.jsonl`` (resumable too) with the usual ``report.md``/``viewer.html``;
3. **report**: ``report.md`` (score and tokens per episode of every row, their ratios to the
   untrained system, training wall time and selected data per iteration), ``demo.json`` and
   ``demo_<task>.png`` (score and tokens per iteration). With ``--update-readme`` the block between
   ``<!-- begin demo -->`` and ``<!-- end demo -->`` of ``README.md`` is rewritten from the run.

Why these sizes: see the docstring of :data:`DEMO_TASKS` (and the README's demo section).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.methods import PlaySettings, build_methods
from benchmarks.outputs import collect_results, write_outputs
from benchmarks.store import EpisodeStore
from benchmarks.suites import get_suite
from benchmarks.units import TaskEntry, open_task, play_methods
from optima_env import make_task
from optima_env.errors import DataError, MissingDependencyError, TaskContractError
from optima_env.io import write_json_atomic, write_text_atomic

__all__ = ["DEMO_TASKS", "DemoTask", "readme_block", "run_demo", "update_readme"]

logger = logging.getLogger("benchmarks.demo")

README_BEGIN = "<!-- begin demo -->"
README_END = "<!-- end demo -->"


@dataclass(frozen=True, kw_only=True)
class DemoTask:
    """One task of the demo: what is trained, how, and what it is evaluated on."""

    name: str
    """Short name (folder and plot names)."""
    task: str
    """Registered task id."""
    task_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the task factory (training and evaluation alike)."""
    model: str = "embedded"
    """The starting (untrained) model: ``embedded``, a Hugging Face name or a local folder."""
    train: Mapping[str, Any] = field(default_factory=dict)
    """:class:`~optima_trainers.config.TrainConfig` overrides (dotted names) on top of the cpu profile."""
    eval_split: str = "test"
    """Held-out split of the evaluation."""
    eval_label: str = ""
    """What that split is, when its name does not say (HotpotQA's ``test`` is the dev set)."""
    eval_instances: int = 40
    """Held-out instances evaluated (the first N of the split)."""
    why: str = ""
    """The reasons for these choices (printed in the report)."""


DEMO_TASKS: tuple[DemoTask, ...] = (
    DemoTask(
        name="synth",
        task="ie/synth-v0",
        task_kwargs={"hops": 1, "num_distractors": 1, "style": "small"},
        train={
            "iterations": 3,
            "generation.instances": 24,
            "generation.num_samples": 4,
            "generation.max_turns": 6,
            "generation.max_new_tokens": 48,
            "generation.init_temperature": 0.5,
            "generation.temperature": 0.5,
            "reward_preset": "paper",
            "selection.theta": -100.0,
            "selection.min_task_score": 1e-9,
            "sft.learning_rate": 2e-4,
            "sft.epochs": 2,
            "sft.batch_size": 8,
            "sft.per_device_batch_size": 4,
        },
        eval_instances=40,
        why=(
            "SmolLM2-135M almost never named the answer in the default 2-hop setting in our trials, "
            "whatever the prompt, so the demo uses the 1-hop "
            "warm-up: Alice holds the answering fact among a rival, Bob only a rival, and Bob can "
            "agree only on what Alice tells him. Answers in style 'small' (the tag, else "
            "'Answer: x', else the whole turn, which F1 credits partly): the model never writes "
            "<A> tags. T=0.5 in every iteration (the paper's prompt at T=0.5 gave the most "
            "conversations with some credit in our trials). Selection: among conversations with a task score "
            "above 0, the best per instance by the Eq. 1 reward (preset 'paper'; lambda_token 0.6), "
            "top 70% of instances; theta_sft off, since at this model size the reward cannot "
            "separate a partly right answer from a short wrong one. LoRA r=16, lr 2e-4, 2 epochs."
        ),
    ),
    DemoTask(
        name="hotpotqa",
        task="ie/hotpotqa-v0",
        task_kwargs={"style": "small"},
        train={
            "iterations": 1,
            "generation.instances": 24,
            "generation.num_samples": 3,
            "generation.max_turns": 4,
            "generation.max_new_tokens": 48,
            "generation.init_temperature": 0.5,
            "generation.temperature": 0.5,
            "reward_preset": "paper",
            "selection.theta": -100.0,
            "selection.min_task_score": 1e-9,
            "generation.diverse_init": False,
            "sft.learning_rate": 2e-4,
            "sft.epochs": 2,
            "sft.batch_size": 8,
            "sft.per_device_batch_size": 4,
        },
        eval_instances=30,
        eval_label="the dev set",
        why=(
            "the paper's prompt and dealing (first sentences of the paragraphs, as the reference "
            "loader), answers read in style 'small' as above; trained on the first rows of the "
            "200-row train file (the cursor never reaches dev), evaluated on the first dev rows. "
            "The same selection as the synthetic task; one iteration (the initialization) of 24 "
            "instances x 3 samples, and 30 dev instances: its prompts are several times longer than "
            "the synthetic task's, and more did not fit the session's CPU budget."
        ),
    ),
)
"""The demo's tasks and their settings (``--task`` picks some of them by name)."""


def _iteration_label(stage: str) -> str:
    return f"iSFT {stage.replace('iter_', 'iter ')}"


def _config(spec: DemoTask) -> Any:
    from optima_trainers.config import resolve_config

    return resolve_config(
        spec.task, "isft", task_kwargs=dict(spec.task_kwargs), model=spec.model, overrides=dict(spec.train)
    )


def _train(
    spec: DemoTask, root: Path, *, progress: bool
) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """Train (or resume) the task's iSFT run; returns ``[(stage, checkpoint)]`` and its metrics."""
    from optima_trainers.loop import IterativeTrainer, plan_stages
    from optima_trainers.runs import RunDir

    folder = root / "train"
    if (folder / "config.json").is_file():
        run_dir, stored = RunDir.open(folder)
        config = _config(spec)
        differ = {
            k: (v, config.to_dict()[k])
            for k, v in stored.to_dict().items()
            if k != "iterations" and config.to_dict().get(k) != v
        }
        if differ:
            raise TaskContractError(
                f"{folder} holds a run with other settings than the demo's {spec.name!r} task "
                f"(stored, now): {differ}; only the number of iterations may change on resume: "
                "use another --out or delete the folder"
            )
    else:
        config = _config(spec)
        run_dir = RunDir.create(config, run_dir=folder)
    metrics = IterativeTrainer(config, run_dir=run_dir, progress=progress).run()
    stages = []
    for stage in plan_stages(config):
        record = json.loads((folder / stage.name / "result.json").read_text(encoding="utf-8"))
        stages.append((stage.name, str(run_dir.model_path(record["model"]))))
    return stages, metrics


def _evaluate(
    spec: DemoTask,
    root: Path,
    checkpoints: Sequence[tuple[str, str]],
    *,
    concurrency: int,
    command: str,
    git_commit: str,
) -> dict[str, Any]:
    """Evaluate the untrained system, CoT and every checkpoint on the held-out instances."""
    started, wall_started = time.perf_counter(), time.time()
    train = spec.train
    settings = PlaySettings(
        max_turns=int(train["generation.max_turns"]),
        max_new_tokens=int(train["generation.max_new_tokens"]),
        temperature=0.0,
        stop_at_speaker_tags=True,
    )
    named = {_iteration_label(stage): path for stage, path in checkpoints}
    methods = build_methods(("mad", "cot"), named, settings)
    entry = open_task(
        (spec.task,), explicit=True, suite=get_suite("demo"), split=spec.eval_split,
        episodes=spec.eval_instances, pm=None, task_kwargs=spec.task_kwargs,
    )  # fmt: skip
    folder = root / "eval"
    folder.mkdir(parents=True, exist_ok=True)
    store = EpisodeStore(folder / "episodes.jsonl")
    resumed = len(store)
    timing_path = folder / "timing.json"  # generation seconds, summed over invocations
    spent = (
        float(json.loads(timing_path.read_text(encoding="utf-8"))["generate_s"])
        if timing_path.is_file()
        else 0.0
    )
    generating = time.perf_counter()
    play_methods(
        methods, [entry], store, settings=settings, split=spec.eval_split, concurrency=concurrency,
        backend="hf", default_model=spec.model,
    )  # fmt: skip
    if len(store) > resumed or not timing_path.is_file():
        spent += time.perf_counter() - generating
        write_json_atomic(timing_path, {"generate_s": round(spent, 1)})
    results = collect_results([entry], methods, store)
    results.update(
        run_name=f"demo/{spec.name}",
        suite="demo",
        model=spec.model,
        backend="hf",
        token_counter="the tokenizer of the model that played (len(tokenizer.tokenize(turn text)))",
        data_dir=os.environ.get("OPTIMA_DATA_DIR"),
        split=spec.eval_split,
        settings=dataclasses.asdict(settings),
        git_commit=git_commit,
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(wall_started)),
        command=command.split(),
        units={"generated": len(store) - resumed, "resumed": resumed},
        wall_time_s=round(time.perf_counter() - started, 1),
        eval_generate_s=round(spent, 1),
    )
    write_outputs(folder, results, store, viewer_limit=10)
    return results


def _summary(
    spec: DemoTask, results: Mapping[str, Any], train_metrics: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    rows = {r["method_key"]: r for r in results["rows"]}
    base = rows.get("mad")
    per_stage = {m["stage"]: m for m in train_metrics}
    table = []
    for key, row in rows.items():
        entry: dict[str, Any] = {
            "method": row["method"],
            "score": row["score"],
            "tokens": row["mean_tokens"],
            "instances": row["instances"],
        }
        if base and base["score"] is not None and row["score"] is not None:
            entry["score_ratio"] = row["score"] / base["score"] if base["score"] > 0 else None
            entry["token_ratio"] = row["mean_tokens"] / base["mean_tokens"] if base["mean_tokens"] else None
        stage = key.removeprefix("ckpt:iSFT ").replace("iter ", "iter_") if key.startswith("ckpt:") else None
        if stage in per_stage:
            metrics = per_stage[stage]
            keys = ("select/selected", "rollout/task_score", "rollout/tokens", "train/loss")
            entry["train"] = {k: metrics[k] for k in keys if k in metrics}
            entry["train"]["time/total_s"] = sum(v for k, v in metrics.items() if k.startswith("time/"))
        table.append(entry)
    return {
        "task": spec.task,
        "name": spec.name,
        "task_kwargs": dict(spec.task_kwargs),
        "train": dict(spec.train),
        "eval_split": spec.eval_split + (f" ({spec.eval_label})" if spec.eval_label else ""),
        "status": results["tasks"][0]["status"],
        "reason": results["tasks"][0]["reason"],
        "why": spec.why,
        "rows": table,
    }


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ratio(value: Any) -> str:
    return "–" if value is None else f"{value:.2f}x"


def task_table(summary: Mapping[str, Any]) -> str:
    """The Markdown table of one demo task."""
    lines = [
        "| System | Score (F1) | Tokens / episode | Score vs untrained | Tokens vs untrained |",
        "|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        lines.append(
            f"| {row['method']} | {_fmt(row['score'])} | {_fmt(row['tokens'], 1)} | "
            f"{_ratio(row.get('score_ratio'))} | {_ratio(row.get('token_ratio'))} |"
        )
    return "\n".join(lines)


def readme_block(demo: Mapping[str, Any]) -> str:
    """The README's demo block (between the markers), from ``demo.json``'s content."""
    parts = [
        f"Generated by `{demo['command']}` ({(demo['train_s'] + demo['eval_s']) / 60:.0f} min of "
        "training and evaluation on 2 CPU cores, summed over tasks and invocations); "
        f"full report: [`{demo['report']}`]({demo['report']}).",
        "",
    ]
    for summary in demo["tasks"]:
        parts.append(
            f"**{summary['task']}** (split {summary['eval_split']}, greedy, "
            f"{summary['rows'][0]['instances'] if summary['rows'] else 0} held-out instances):"
        )
        parts.append("")
        if summary["status"] != "ok":
            parts.append(f"not evaluated: {summary['status']}: {summary['reason']}")
        else:
            parts.append(task_table(summary))
            if summary.get("plot"):
                parts.append("")
                parts.append(f"![{summary['name']}]({demo['folder']}/{summary['plot']})")
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def update_readme(readme: Path, block: str) -> None:
    """Replace what lies between the demo markers of ``readme`` with ``block``."""
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise DataError(
            f"{readme}: expected the markers {README_BEGIN!r} and {README_END!r} (in that order); "
            "add them where the demo table should go"
        )
    head = text[: start + len(README_BEGIN)]
    write_text_atomic(readme, f"{head}\n{block}{text[end:]}")


def _plot(summary: Mapping[str, Any], path: Path) -> bool:
    from benchmarks.plots import _pyplot

    rows = [r for r in summary["rows"] if r["score"] is not None]
    base = next((r for r in rows if r["method"] == "MAD"), None)
    iters = [r for r in rows if r["method"].startswith("iSFT")]
    if base is None or not iters:
        return False
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.6))
    xs = list(range(len(iters) + 1))
    labels = ["untrained"] + [r["method"].removeprefix("iSFT ") for r in iters]
    for ax, key, title in ((left, "score", "score (F1)"), (right, "tokens", "tokens / episode")):
        ax.plot(xs, [base[key]] + [r[key] for r in iters], marker="o", label="2-agent system")
        cot = next((r for r in rows if r["method"] == "CoT"), None)
        if cot is not None:
            ax.axhline(cot[key], color="gray", linestyle="--", label="CoT (untrained, 1 agent)")
        ax.set_xticks(xs, labels)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{summary['task']}: {title}")
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render_report(demo: Mapping[str, Any]) -> str:
    """``report.md`` of the demo."""
    parts = [
        "# Optima demo: iSFT on CPU with the embedded model",
        "",
        f"Command: `{demo['command']}`  ",
        f"Compute: training {demo['train_s'] / 60:.1f} min and evaluation {demo['eval_s'] / 60:.1f} min "
        "(summed over the invocations that did the work; a resumed run reuses what is done); "
        f"this invocation started {demo['started']} and took {demo['wall_time_s'] / 60:.1f} min; "
        f"git commit {demo['git_commit']}; torch threads {demo['threads']}.",
        "",
        "Rows: **MAD** is the untrained 2-agent system (the task's own prompts, the base model); "
        "**CoT** the untrained model alone; **iSFT iter k** the 2-agent system with the checkpoint "
        "after iteration k (iter 00 is the initialization). Greedy decoding, held-out instances, "
        "the same turn and token caps as training. Ratios are to the untrained system (MAD).",
        "",
    ]
    for summary in demo["tasks"]:
        parts += [f"## {summary['task']}", ""]
        if summary["status"] != "ok":
            parts += [f"Not evaluated: {summary['status']}: {summary['reason']}", ""]
            continue
        parts += [task_table(summary), ""]
        if summary.get("plot"):
            parts += [f"![{summary['name']}]({summary['plot']})", ""]
        parts += ["Training, per iteration (selected trajectories; the sampled episodes' mean score "
                  "and tokens; SFT loss; stage wall time):", "",
                  "| Iteration | Selected | Sampled score | Sampled tokens | Train loss | Wall s |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for row in summary["rows"]:
            t = row.get("train")
            if t:
                cells = [
                    row["method"],
                    _fmt(int(t["select/selected"]) if "select/selected" in t else None),
                    _fmt(t.get("rollout/task_score")),
                    _fmt(t.get("rollout/tokens"), 1),
                    _fmt(t.get("train/loss")),
                    _fmt(t.get("time/total_s"), 0),
                ]
                parts.append("| " + " | ".join(cells) + " |")
        parts += ["", f"Settings: task kwargs `{json.dumps(summary['task_kwargs'])}`, training overrides "
                  f"`{json.dumps(summary['train'])}` on the cpu profile, evaluated on split "
                  f"`{summary['eval_split']}`.", "", f"Why: {summary['why']}", ""]  # fmt: skip
    return "\n".join(parts)


def run_demo(
    out: Path,
    *,
    names: Sequence[str] = (),
    tasks: Sequence[DemoTask] = DEMO_TASKS,
    concurrency: int = 16,
    update_readme_path: Path | None = None,
    command: str = "python -m benchmarks.run --suite demo",
    git_commit: str = "",
    threads: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train and evaluate every demo task (or those in ``names``); write the report and plots."""
    specs = [s for s in tasks if not names or s.name in names or s.task in names]
    if not specs:
        raise TaskContractError(
            f"no demo task named {', '.join(names)}; expected one of {', '.join(s.name for s in tasks)}"
        )
    started = time.time()
    out.mkdir(parents=True, exist_ok=True)
    summaries, train_s, eval_s = [], 0.0, 0.0
    for spec in specs:
        root = out / spec.name
        try:
            make_task(spec.task, **dict(spec.task_kwargs)).samples("train")[0]
        except (DataError, MissingDependencyError) as exc:
            logger.warning("demo task %s skipped: %s", spec.task, exc)
            summaries.append(_summary(spec, _missing(spec, exc), []))
            continue
        checkpoints, metrics = _train(spec, root, progress=progress)
        # the stages' own phase timings, summed over every invocation that worked on them
        train_s += sum(v for m in metrics for k, v in m.items() if k.startswith("time/"))
        results = _evaluate(
            spec, root, checkpoints, concurrency=concurrency, command=command, git_commit=git_commit
        )
        eval_s += results["eval_generate_s"]
        summary = _summary(spec, results, metrics)
        plot = f"demo_{spec.name}.png"
        if _plot(summary, out / plot):
            summary["plot"] = plot
        summaries.append(summary)
    demo = {
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(started)),
        "wall_time_s": round(time.time() - started, 1),
        "train_s": round(train_s, 1),
        "eval_s": round(eval_s, 1),
        "git_commit": git_commit,
        "threads": threads if threads is not None else os.environ.get("OMP_NUM_THREADS", "torch default"),
        "folder": str(out),
        "report": str(out / "report.md"),
        "tasks": summaries,
    }
    write_json_atomic(out / "demo.json", demo)
    write_text_atomic(out / "report.md", render_report(demo))
    if update_readme_path is not None:
        update_readme(update_readme_path, readme_block(demo))
    print(render_report(demo))
    return demo


def _missing(spec: DemoTask, exc: Exception) -> dict[str, Any]:
    entry = TaskEntry(task=spec.task)
    entry.miss(exc)
    return {"rows": [], "tasks": [{"status": entry.status, "reason": entry.reason}]}
