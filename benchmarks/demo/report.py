"""The demo's numbers and pages: per-task summaries with bootstrap intervals, plots, ``report.md``
and the README block (:mod:`benchmarks.demo.suite` computes, this module only reads and writes)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.demo.clock import total_seconds
from benchmarks.demo.control import CONTROL, add_control, diff_cell, learning_lines, missing_line
from benchmarks.demo.shortcut import shortcut_lines
from benchmarks.demo.tasks import DemoTask, eval_settings, trainer_label
from benchmarks.evaluation.controls import CEILING_LABEL, add_controls
from benchmarks.reports.intervals import add_intervals, cell
from optima_env.io import write_json_atomic, write_text_atomic

__all__ = ["readme_block", "render_report", "summarize", "table1", "table_rows", "write_pages"]


def _row(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: row.get(k) for k in ("method", "score", "instances", "score_ci", "tokens_ci")}
    out |= {k: row.get(k) for k in ("score_ratio", "score_ratio_ci", "token_ratio", "token_ratio_ci")}
    out |= {k: row.get(k) for k in ("score_vs_m0", "score_vs_m0_ci", "tokens_vs_m0", "tokens_vs_m0_ci")}
    out |= {k: row.get(k) for k in ("f1", "score_vs_system", "score_vs_system_ci")}
    return out | {"key": row["method_key"], "tokens": row["mean_tokens"], "control": bool(row.get("control"))}


_TERMS = ("task", "token", "readability")
"""The reward terms whose mean gap over a DPO stage's pairs the curves keep."""


def _curve(
    run: Any, rows: Mapping[str, dict[str, Any]], labels: Mapping[tuple[str, str], str]
) -> list[dict[str, Any]]:
    """Per-stage points of one run: the held-out score and tokens, and the training metrics."""
    points = []
    by_stage = {m.get("stage"): m for m in run.metrics}
    for stage, _ in run.stages:
        metrics = by_stage.get(stage, {})
        held = rows.get(labels.get((run.trainer, stage), ""))
        points.append(
            {
                "stage": stage,
                "score": held["score"] if held else None,
                "tokens": held["tokens"] if held else None,
                "score_ci": held["score_ci"] if held else None,
                "selected": metrics.get("select/selected"),
                "pairs": metrics.get("mcts/pairs"),
                "sampled_score": metrics.get("rollout/task_score"),
                "sampled_tokens": metrics.get("rollout/tokens"),
                "loss": metrics.get("train/loss"),
                # a DPO stage's held-out pairs after training (absent in records before they were kept)
                "pair_accuracy": metrics.get("train/eval_rewards/accuracies"),
                "pair_margin": metrics.get("train/eval_rewards/margins"),
                "eval_pairs": metrics.get("train/eval_pairs"),
                # what decided the stage's pairs: the mean gap of each reward term (pair_summary)
                "pair_gaps": {t: metrics[f"mcts/gap/{t}"] for t in _TERMS if f"mcts/gap/{t}" in metrics},
                "wall_s": sum(v for k, v in metrics.items() if k.startswith("time/")),
                "shared": stage == run.shared,
            }
        )
    return points


# size: the demo's per-task inputs (tables, scaling, runs, exports, timings), each a separate record
def summarize(
    spec: DemoTask,
    main: Mapping[str, Any] | None,
    scaling: Mapping[str, Any] | None,
    runs: Sequence[Any],
    exports: Mapping[str, Mapping[str, Any]],
    *,
    stages: Mapping[str, Any] | None = None,
    labels: Mapping[tuple[str, str], str] | None = None,
    finals: Mapping[str, str] | None = None,
    status: tuple[str, str] | None = None,
    baselines: Mapping[str, Any] | None = None,
    control: str | None = None,
    ceiling: float | None = None,
) -> dict[str, Any]:
    """The summary of one task (``demo.json``'s entry): rows with intervals, curves, targets.

    ``main`` holds the table's rows (baselines and adapters), ``stages`` every training stage's on
    the first held-out instances with MAD and CoT on the same ones (the curves). ``labels`` maps
    every (trainer, stage) of ``runs`` to its row in ``stages`` (:func:`benchmarks.demo.suite.row_labels`),
    ``finals`` the row of each run's committed adapter to the run's name (``iSFT``): those rows
    are the trained systems of the table. ``baselines`` is the untrained baselines' pass before
    training (its episodes are the table's; only its generation time is added here). ``control``
    is M_0's row label (:func:`benchmarks.demo.control.control_label`): every row of both tables
    gets its paired difference to M_0's, and ``control_missing`` says why a table has no M_0 row.
    ``ceiling`` is the task's computed shortcut ceiling (:func:`benchmarks.evaluation.controls.task_ceiling`),
    shown as the table's first row when the task plays its controls.
    """
    summary: dict[str, Any] = {
        "task": spec.task,
        "name": spec.name,
        "task_kwargs": dict(spec.task_kwargs),
        "eval_split": spec.eval_split + (f" ({spec.eval_label})" if spec.eval_label else ""),
        "settings": {k: getattr(eval_settings(spec), k) for k in ("max_turns", "max_new_tokens", "sc_n")},
        "train": {t: spec.config_overrides(t) for t in spec.trainers},
        "departures": list(spec.departures),
        "status": status[0] if status else main["tasks"][0]["status"] if main else "missing",
        "reason": status[1] if status else main["tasks"][0]["reason"] if main else "",
        "rows": [],
        "ceiling": ceiling,
        "retired": spec.retired,
        "caption": spec.caption,
    }
    if main is None:
        return summary
    rows, missing = table_rows(main, control)
    stage_rows, stages_missing = table_rows(stages, control) if stages else ([], None)
    summary["control"] = control
    summary["control_missing"] = {
        k: v for k, v in (("table", missing), ("stages", stages_missing if stages else None)) if v
    }
    played = (baselines, main, stages, scaling)  # each phase's generation time, from its timing.json
    for row in rows:
        row["final_of"] = (finals or {}).get(row["method"])
    by_label = {r["method"]: r for r in stage_rows}
    summary.update(
        rows=rows,
        stage_rows=stage_rows,
        curves={trainer_label(r.trainer): _curve(r, by_label, labels or {}) for r in runs},
        adapters={
            trainer_label(t): {
                k: m.get(k) for k in ("bytes", "rank", "dtype", "delta_relative_error", "folder")
            }
            for t, m in exports.items()
        },
        train_s=round(sum(r.compute_s() for r in runs), 1),
        eval_s=round(sum((r or {}).get("eval_generate_s", 0.0) for r in played), 1),
        scaling=(scaling or {}).get("curves", {}).get(spec.task, {}),
        targets=_targets(spec, rows),
    )
    return summary


def table_rows(results: Mapping[str, Any], control: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """The table's rows with their intervals, ratios to MAD and differences to M_0 (``control``,
    its row label), and why M_0 is missing (None when it is there)."""
    add_intervals(results["rows"], base_key="mad")
    missing = add_control(results["rows"], control)
    add_controls(dict(results), ())  # each counterfactual row's paired difference to its system
    return [_row(r) for r in results["rows"]], missing


def _targets(spec: DemoTask, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    finals = [r for r in rows if r.get("final_of") and r.get("score") is not None]
    cot = next((r for r in rows if r["key"] == "cot"), None)
    if not finals:
        return {}
    best = max(finals, key=lambda r: r["score"])
    out = {
        "best": best["final_of"],
        "best_score": best["score"],
        "score_ratio": best.get("score_ratio"),
        "token_ratio": best.get("token_ratio"),
        "wanted_score_ratio": spec.target_score_ratio,
        "wanted_token_ratio": spec.target_token_ratio,
    }
    met = [
        out["score_ratio"] is not None and out["score_ratio"] >= spec.target_score_ratio,
        out["token_ratio"] is not None and out["token_ratio"] <= spec.target_token_ratio,
    ]
    if spec.target_above_cot and cot is not None:
        out["cot_score"] = cot["score"]
        met.append(best["score"] > cot["score"])
    out["met"] = all(met)
    return out


def write_pages(
    out: Path,
    summaries: Sequence[Mapping[str, Any]],
    *,
    command: str,
    git_commit: str,
    started: float,
    threads: int | None,
    pending: Sequence[str] = (),
    invocation_command: str | None = None,
) -> dict[str, Any]:
    """Write ``demo.json`` and ``report.md`` for the tasks done so far (after each task);
    ``pending`` names the tasks still to run; ``command`` reproduces the whole report,
    ``invocation_command`` (default: ``command``) is this invocation's."""
    invocations_s, invocations, since = total_seconds(out / "invocations.json")
    demo = {
        "command": command,
        "invocation_command": invocation_command or command,
        "started": time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(started)),
        "wall_time_s": round(time.time() - started, 1),
        "train_s": round(sum(s.get("train_s", 0.0) for s in summaries), 1),
        "eval_s": round(sum(s.get("eval_s", 0.0) for s in summaries), 1),
        "invocations_s": invocations_s,
        "invocations_since": since,
        "invocations": invocations,
        "git_commit": git_commit,
        "threads": threads if threads is not None else os.environ.get("OMP_NUM_THREADS", "torch default"),
        "folder": str(out),
        "report": str(out / "report.md"),
        "tasks": list(summaries),
        "pending": list(pending),
    }
    write_json_atomic(out / "demo.json", demo)
    write_text_atomic(out / "report.md", render_report(demo))
    return demo


# -- tables ---------------------------------------------------------------------------------------
def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table1(summary: Mapping[str, Any], *, stages: bool = False) -> str:
    """The Table-1-style table of one task: baselines and trained systems (``stages``: every
    training stage, beside MAD and CoT on the same instances)."""
    controls = summary.get("ceiling") is not None
    lines = [
        "| System | Score (95% CI) |" + (" F1 |" if controls else "") + " Tokens / episode (95% CI) "
        f"| Score vs MAD | Tokens vs MAD | Score − {CONTROL} (95% CI) | Tokens − {CONTROL} (95% CI) |"
        + (" Counterfactual − system (95% CI) |" if controls else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|" if controls else ""),
    ]
    if controls and not stages:
        lines.append(f"| {CEILING_LABEL} | {summary['ceiling']:.3f} |" + " – |" * 8)
    for row in summary.get("stage_rows", []) if stages else summary["rows"]:
        label = row.get("final_of") or row["method"]
        if row.get("control"):
            label = f"{CONTROL} ({label}, shared initialization)"
        lines.append(
            f"| {label} | {cell(row['score'], row['score_ci'])} | "
            + (f"{cell(row.get('f1'))} | " if controls else "")
            + f"{cell(row['tokens'], row['tokens_ci'], 1)} | "
            f"{cell(row.get('score_ratio'), row.get('score_ratio_ci'), 2, 'x')} | "
            f"{cell(row.get('token_ratio'), row.get('token_ratio_ci'), 2, 'x')} | "
            f"{diff_cell(row.get('score_vs_m0'), row.get('score_vs_m0_ci'), 3)} | "
            f"{diff_cell(row.get('tokens_vs_m0'), row.get('tokens_vs_m0_ci'), 1)} |"
            + (f" {diff_cell(row.get('score_vs_system'), row.get('score_vs_system_ci'), 3)} |" * controls)
        )
    missing = missing_line(summary, stages=stages)
    return "\n".join(lines) + (f"\n\n{missing}" if missing else "")


def _pairs(point: Mapping[str, Any]) -> str:
    """A DPO stage's held-out pair accuracy and mean reward margin (``–`` for SFT stages and for
    records written before DPO stages evaluated their held-out pairs)."""
    accuracy, margin = point.get("pair_accuracy"), point.get("pair_margin")
    return "–" if accuracy is None else f"{accuracy:.2f} / {_fmt(margin, 4)}"


def _curve_table(summary: Mapping[str, Any]) -> list[str]:
    lines = [
        "| Run | Stage | Held-out score | Held-out tokens | Selected / pairs | Sampled score | Train loss "
        "| Held-out pair accuracy / margin | Wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run, points in summary.get("curves", {}).items():
        for p in points:
            data = p["selected"] if p["selected"] is not None else p["pairs"]
            lines.append(
                f"| {run} | {p['stage']}{' (shared M_0)' if p['shared'] else ''} | {_fmt(p['score'])} | "
                f"{_fmt(p['tokens'], 1)} | {_fmt(int(data) if data is not None else None)} | "
                f"{_fmt(p['sampled_score'])} | {_fmt(p['loss'])} | {_pairs(p)} | {_fmt(p['wall_s'], 0)} |"
            )
    return lines


def _target_line(summary: Mapping[str, Any]) -> str:
    """The target, then each of its parts as measured: met, or not and by how much."""
    t = summary.get("targets") or {}
    if not t:
        return ""
    score, tokens = t["score_ratio"], t["token_ratio"]
    wanted_score, wanted_tokens = t["wanted_score_ratio"], t["wanted_token_ratio"]
    if score is None or score < wanted_score:
        short = "" if score is None else f", {wanted_score - score:.2f}x short of {wanted_score:g}x"
        score_part = f"score {_fmt(score, 2)}x MAD's (not met{short})"
    else:
        score_part = f"score {_fmt(score, 2)}x MAD's (met)"
    if tokens is None or tokens > wanted_tokens:
        over = (
            "" if tokens is None else f", {tokens / wanted_tokens:.1f} times the {wanted_tokens:.0%} allowed"
        )
        token_part = f"tokens {_pct(tokens)} of MAD's (not met{over})"
    else:
        token_part = f"tokens {_pct(tokens)} of MAD's (met)"
    parts = [score_part, token_part]
    if "cot_score" in t:
        best, cot = t.get("best_score"), t["cot_score"]
        above = best is not None and best > cot
        parts.append(f"score {_fmt(best)} against CoT's {_fmt(cot)} ({'met' if above else 'not met'})")
    head = (
        f"Target: the best trained system ({t['best']}) at least {wanted_score:g}x MAD's score with at most "
        f"{wanted_tokens:.0%} of its tokens" + (" and above CoT" if "cot_score" in t else "")
    )
    if t["met"]:
        return f"{head} — met: " + "; ".join(parts) + "."
    return (
        f"{head} — **not met**: "
        + "; ".join(parts)
        + ". The per-iteration curves show where training stopped."
    )


def _checks(summary: Mapping[str, Any]) -> list[str]:
    """The task's target check: against the controls where it plays them, else the ratio target,
    then whether any trained row differs from MAD, and the task's caption."""
    lines = shortcut_lines(summary) if summary.get("ceiling") is not None else [_target_line(summary), ""]
    finals = [r for r in summary.get("rows", []) if r.get("final_of") and r.get("score_ratio_ci")]
    if finals and all(r["score_ratio_ci"][0] <= 1.0 <= r["score_ratio_ci"][1] for r in finals):
        shown = ", ".join(
            f"{r['final_of']} {cell(r['score_ratio'], r['score_ratio_ci'], 2, 'x')}" for r in finals
        )
        lines += [f"No trained row differs from MAD: every one's score-ratio interval includes 1 ({shown}).",
                  ""]  # fmt: skip
    return lines + ([summary["caption"], ""] if summary.get("caption") else [])


def _pct(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.1%}"


# size: the report's sections in page order, each a rendered block
def render_report(demo: Mapping[str, Any]) -> str:
    """``report.md`` of the demo."""
    parts = [
        "# Optima demo: Table 1 on 2 CPU cores with the embedded model",
        "",
        f"Command: `{demo['command']}`"
        + (
            f" (this invocation: `{demo['invocation_command']}`)  "
            if demo.get("invocation_command", demo["command"]) != demo["command"]
            else "  "
        ),
        f"Compute: training {demo['train_s'] / 60:.1f} min and evaluation {demo['eval_s'] / 60:.1f} min, "
        "summed over every invocation that did the work (a resumed run reuses what is done; the "
        "shared initialization is counted once; a phase cut short by a kill is not); the demo "
        f"process ran {demo.get('invocations_s', 0.0) / 60:.1f} min of wall time over "
        f"{demo.get('invocations', 0)} invocations"
        + (f" since {demo['invocations_since']}" if demo.get("invocations_since") else "")
        + " (invocations.json); this invocation started "
        f"{demo['started']} and took {demo['wall_time_s'] / 60:.1f} min; git commit {demo['git_commit']}; "
        f"torch threads {demo['threads']}."
        + (
            f" Tables re-rendered from the committed results, no model run: {demo['rerendered']}."
            if demo.get("rerendered")
            else ""
        ),
        "",
        "Rows: **CoT** the untrained model alone with all the evidence, **SC** its majority vote over "
        "8 samples (T=0.7), **MAD** the untrained 2-agent system with natural-language prompts, "
        "**AutoForm** the untrained 2-agent system with AutoForm prompts; **iSFT / iDPO / iSFT-DPO** "
        "the 2-agent system with each run's final model (its committed adapter). Greedy, held-out "
        "instances, the same caps for every system. Intervals: 95% percentile bootstrap over "
        "instances (2000 resamples); ratios are paired over the same instances.",
        "",
    ]
    current = [s for s in demo["tasks"] if not s.get("retired")]
    retired = [s for s in demo["tasks"] if s.get("retired")]
    for s in [*current, *retired]:
        if s is (retired or [None])[0]:
            parts += ["# History: retired tables", ""]
        parts += [f"## {s['task']}", ""] + ([s["retired"], ""] if s.get("retired") else [])
        if s["status"] != "ok":
            parts += [f"Not evaluated: {s['status']}: {s['reason']}", ""]
            continue
        n = s["rows"][0]["instances"] if s["rows"] else 0
        parts += [
            f"{n} held-out instances of split {s['eval_split']}; caps: {s['settings']['max_turns']} "
            f"turns of at most {s['settings']['max_new_tokens']} new tokens.",
            "",
            table1(s),
            "",
            *_checks(s),
            *learning_lines(s),
        ]
        parts += [f"![{name}]({name})" for name in s.get("plots", [])] + [""]
        m = s["stage_rows"][0]["instances"] if s.get("stage_rows") else 0
        parts += [
            f"Every training stage on the first {m} of those instances (MAD and CoT on the same "
            "ones), and its training data:",
            "",
            table1(s, stages=True),
            "",
        ]
        parts += [*_curve_table(s), ""]
        if s.get("adapters"):
            parts += ["Committed adapters (the final model of each run as a LoRA adapter):", ""]
            for name, a in s["adapters"].items():
                err = a.get("delta_relative_error") or {}
                parts.append(
                    f"- {name}: `{a['folder']}`, rank {a.get('rank')}, {a.get('dtype')}, "
                    f"{(a.get('bytes') or 0) / 1e6:.1f} MB, weight-change relative error mean "
                    f"{_fmt(err.get('mean'))} / max {_fmt(err.get('max'))}"
                )
            parts.append("")
        parts += ["Departures from the spec, and why:", ""] + [f"- {d}" for d in s["departures"]] + [""]
        parts += [f"Training overrides per trainer (on the cpu profile): `{json.dumps(s['train'])}`; task "
                  f"kwargs `{json.dumps(s['task_kwargs'])}`.", ""]  # fmt: skip
    parts += _pending_line(demo)
    return "\n".join(parts)


def _pending_line(demo: Mapping[str, Any]) -> list[str]:
    if not demo.get("pending"):
        return []
    return [
        f"Still to run: {', '.join(demo['pending'])} (the same command resumes the demo from its folder).",
        "",
    ]


def readme_block(demo: Mapping[str, Any]) -> str:
    """The README's demo block (between the markers), from ``demo.json``'s content."""
    parts = [
        f"Generated by `{demo['command']}` ({(demo['train_s'] + demo['eval_s']) / 60:.0f} min of "
        "training and evaluation on 2 CPU cores, summed over tasks and invocations); "
        f"full report: [`{demo['report']}`]({demo['report']})."
        + (f" Tables re-rendered, no model run: {demo['rerendered']}." if demo.get("rerendered") else ""),
        "",
    ]
    for s in demo["tasks"]:
        n = s["rows"][0]["instances"] if s["rows"] else 0
        if s.get("retired"):
            parts += [f"**{s['task']}** (its table is in the report's history): {s['retired']}", ""]
            continue
        parts += [f"**{s['task']}** (split {s['eval_split']}, greedy, {n} held-out instances):", ""]
        if s["status"] != "ok":
            parts += [f"not evaluated: {s['status']}: {s['reason']}", ""]
            continue
        parts += [table1(s), "", *_checks(s)]
        parts += [f"![{name}]({demo['folder']}/{name})" for name in s.get("plots", [])] + [""]
    parts += _pending_line(demo)
    return "\n".join(parts).rstrip() + "\n"
