"""From a run's stored episodes to its result rows, and from those to its files.

:func:`collect_results` reduces every (method, task) to one row from the episodes in the store
(so a resumed run reports exactly what a run in one go would); :func:`write_outputs` writes
``results.json``, ``report.md``, the PNG plots and ``viewer.html``; :func:`written_results` reads
them back when a rerun has nothing new to write; :func:`require_evaluated` refuses a run that left
a task unevaluated (the command's ``--allow-missing`` accepts it).
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.evaluation.methods import Method
from benchmarks.evaluation.store import EpisodeStore
from benchmarks.reports.plots import plot_scaling, plot_score_vs_tokens
from benchmarks.reports.report import long_table, render_report, unread_warnings
from benchmarks.reports.viewer import render_viewer
from optima_env.errors import DataMissingError
from optima_env.io import read_json_object, write_json_atomic, write_text_atomic
from optima_env.scoring import f1
from optima_env.task import metric_name

__all__ = ["collect_results", "require_evaluated", "write_outputs", "write_viewer", "written_results"]

logger = logging.getLogger(__name__)

SCORE_PLOT = "score_vs_tokens.png"
SCALING_PLOT = "scaling.png"
VIEWER = "viewer.html"


def _mean_curve(curves: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Average per-instance curves point by point (all have the same k = 1..K)."""
    return [
        {
            "k": points[0]["k"],
            **{key: statistics.fmean(p[key] for p in points) for key in ("score", "coverage", "tokens")},
        }
        for points in zip(*curves)
    ]


def _f1(groups: Sequence[Sequence[Any]]) -> float | None:
    """The mean SQuAD F1 of the episodes' final answers (an information-exchange row's second
    metric, beside a task metric that is not F1), each instance's episodes averaged first."""
    if not groups or not all(groups):
        return None
    return statistics.fmean(statistics.fmean(f1(e.final_answer, e.gold) for e in g) for g in groups)


def _scorers(groups: Sequence[Sequence[Any]]) -> str:
    """The task scorers that produced a row's episodes (``episode.metadata["scorer"]``, set by the env)."""
    names = sorted({str(e.metadata.get("scorer", "unknown")) for g in groups for e in g})
    return ", ".join(names) or "unknown"


# size: one pass over the run's entries building rows, tasks, methods and curves together
def collect_results(entries: Sequence[Any], methods: Sequence[Method], store: EpisodeStore) -> dict[str, Any]:
    """Rows (one per method and task), tasks, methods and scaling curves of a run.

    Args:
        entries: the run's task entries (``task``, ``family``, ``obj``, ``instances``, ``status``,
            ``reason``), see :class:`benchmarks.run.TaskEntry`.
        methods: the run's methods, in table order.
        store: the run's episodes.
    """
    rows: list[dict[str, Any]] = []
    curves: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for method in methods:
        for entry in entries:
            row: dict[str, Any] = {
                "task": entry.task,
                "family": entry.family,
                "metric": metric_name(entry.obj, entry.family),
                "method": method.label,
                "method_key": method.key,
                "status": entry.status,
                "reason": entry.reason,
                "score": None,
                "scorer": None,
                "mean_tokens": None,
                "episodes": 0,
                "unread": None,
                "instances": 0,
            }
            if entry.obj is not None:
                groups = store.select(method.key, entry.task, range(entry.instances), method.samples)
                reduced = [method.reduce(entry.obj, g) for g in groups]
                if entry.family == "information_exchange":
                    row["f1"] = _f1(groups)
                row.update(
                    scorer=_scorers(groups),
                    score=statistics.fmean(r["score"] for r in reduced),
                    mean_tokens=statistics.fmean(r["tokens"] for r in reduced),
                    episodes=sum(len(g) for g in groups),
                    unread=sum(e.final_answer is None for g in groups for e in g),
                    instances=len(groups),
                    # per instance, in instance order: what the bootstrap intervals resample
                    instance_scores=[float(r["score"]) for r in reduced],
                    instance_tokens=[float(r["tokens"]) for r in reduced],
                )
                if method.aggregate == "scaling":
                    row["coverage"] = statistics.fmean(r["coverage"] for r in reduced)
                    curves.setdefault(entry.task, {})[method.label] = _mean_curve(
                        [r["curve"] for r in reduced]
                    )
            rows.append(row)
    tasks = [
        {
            "task": e.task,
            "family": e.family,
            "metric": metric_name(e.obj, e.family),
            "instances": e.instances if e.obj is not None else 0,
            "status": e.status,
            "reason": e.reason,
            "task_kwargs": dict(e.task_kwargs),
        }
        for e in entries
    ]
    method_info = [
        {
            "key": m.key,
            "label": m.label,
            "agents": m.agents,
            "style": m.style,
            "prompts": m.prompts,
            "samples": m.samples,
            "temperature": m.temperature,
            "aggregate": m.aggregate,
            "model": m.model or "(the run's --model)",
        }
        for m in methods
    ]
    return {"rows": rows, "tasks": tasks, "methods": method_info, "curves": curves}


def write_outputs(
    out: Path,
    results: dict[str, Any],
    store: EpisodeStore,
    *,
    viewer_limit: int,
    episodes: str = "episodes.jsonl",
) -> str:
    """Write results.json, the plots, viewer.html and report.md; returns the long table.

    ``episodes`` is where ``store`` is, relative to ``out`` (recorded in ``results["files"]``).
    """
    plots = []
    if plot_score_vs_tokens(results["rows"], out / SCORE_PLOT):
        plots.append(SCORE_PLOT)
    if results["curves"] and plot_scaling(results["curves"], out / SCALING_PLOT):
        plots.append(SCALING_PLOT)
    results["files"] = {
        "episodes": episodes,
        "report": "report.md",
        "viewer": VIEWER,
        "plots": plots,
    }
    write_viewer(out, results, store, viewer_limit=viewer_limit)
    write_json_atomic(out / "results.json", results)
    write_text_atomic(out / "report.md", render_report(results, plots=plots, viewer=VIEWER))
    for warning in unread_warnings(results["rows"]):
        logger.warning("%s", warning)
    return long_table(results["rows"])


def write_viewer(out: Path, results: dict[str, Any], store: EpisodeStore, *, viewer_limit: int) -> None:
    """Write ``viewer.html``: the first ``viewer_limit`` instances' conversations of every played row
    (a generated page, never committed: every run writes it again)."""
    sections = []
    for row in results["rows"]:
        if row["status"] != "ok":
            continue
        samples = next(m["samples"] for m in results["methods"] if m["key"] == row["method_key"])
        shown = range(min(row["instances"], viewer_limit))
        groups = store.select(row["method_key"], row["task"], shown, samples)
        sections.append((row, [e for g in groups for e in g]))
    write_text_atomic(out / VIEWER, render_viewer(results["run_name"], sections))


def written_results(out: Path, results: dict[str, Any]) -> dict[str, Any] | None:
    """The results ``write_outputs`` wrote into ``out`` when they hold ``results``'s rows, tasks,
    methods and curves and every file they name is there (``viewer.html`` aside: a generated page,
    not committed, that the caller writes again), else None (then write them again).

    A resumed run with nothing left to play keeps them as they are, with the provenance (commit,
    start, wall time, episodes generated) of the invocation that played them.
    """
    path = out / "results.json"
    if not path.is_file():
        return None
    written = read_json_object(path)
    files = written.get("files") or {}
    names = [files.get("report"), *files.get("plots", [])]
    if not all(isinstance(n, str) and (out / n).is_file() for n in names):
        return None
    keys = ("rows", "tasks", "methods", "curves")
    same = json.loads(json.dumps({k: results.get(k) for k in keys}))  # as results.json holds them
    return written if same == {k: written.get(k) for k in keys} else None


def require_evaluated(results: dict[str, Any]) -> None:
    """Refuse, after the outputs are written, a run that left a task unevaluated, so a script
    does not take a table of ``data missing`` rows for success."""
    skipped = [t for t in results.get("tasks", ()) if t.get("status") != "ok"]
    if skipped:
        listed = "; ".join(f"{t['task']} ({t['status']}: {_one_line(t['reason'])})" for t in skipped)
        raise DataMissingError(
            f"expected every task of the run evaluated, got {len(skipped)} of {len(results['tasks'])} not "
            f"evaluated: {listed}; the outputs report them. Give the data (--data-dir or OPTIMA_DATA_DIR) "
            "or the missing extra, or pass --allow-missing to accept a partial run"
        )


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())
