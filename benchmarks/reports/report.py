"""Markdown for a run: the paper-style table, the long table and the run's provenance.

Every number comes from the ``results`` dict that :mod:`benchmarks.run` builds from the run's
episodes; nothing here computes or types in a number of its own. Scores are shown as in the
paper's Table 1 (in %, mean #tokens per instance), each under its task's own metric (``metric`` of
the task, e.g. F1, accuracy, exact match; :func:`optima_env.task.metric_name`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from optima_env.task import metric_name

__all__ = [
    "UNREAD_WARNING_SHARE",
    "long_table",
    "paper_tables",
    "render_report",
    "scaling_table",
    "unread_cell",
    "unread_warnings",
]

UNREAD_WARNING_SHARE = 0.5
"""A row whose share of episodes without a readable answer is above this gets a warning."""

_AGGREGATES = {
    "first": "the one conversation",
    "vote": "SC vote (IE: clusters of pairwise F1 > 0.9, mean F1 of the largest; else majority)",
    "scaling": "per k = 1..K: majority vote (IE F1 >= 0.9), coverage (best of k), total tokens",
}
_FAMILY_TITLES = {"information_exchange": "Information exchange", "debate": "Debate"}


def _cell(text: object) -> str:
    """Text safe inside a Markdown table cell (no pipes, no newlines), at most 200 characters."""
    flat = " ".join(str(text).split()).replace("|", "\\|")
    return flat if len(flat) <= 200 else flat[:197] + "..."


def _status(row: Mapping[str, Any]) -> str:
    return f"{row['status']}: {row.get('reason') or ''}".strip()


def unread_cell(row: Mapping[str, Any]) -> str:
    """``"3 of 8 (38%)"``: the row's episodes whose answer the task could not read (each scored 0);
    ``"–"`` for a row that was not played or was recorded without the count."""
    if row.get("unread") is None or not row.get("episodes"):
        return "–"
    return f"{row['unread']} of {row['episodes']} ({row['unread'] / row['episodes']:.0%})"


def unread_warnings(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per row where more than :data:`UNREAD_WARNING_SHARE` of the episodes ended with no
    answer the task could read: their score of 0 says the model missed the answer format, not
    the question."""
    return [
        f"{r['method']} on {r['task']}: {unread_cell(r)} episodes ended with no answer the task could "
        "read, each scored 0; the model does not write the task's answer format (read its turns in "
        "viewer.html), so the score measures the format, not the task"
        for r in rows
        if r.get("unread") is not None
        and r.get("episodes")
        and r["unread"] / r["episodes"] > UNREAD_WARNING_SHARE
    ]


def long_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per (task, method): score (0-1), the scorer that produced it (and the row's F1 beside
    a task metric that is not F1), mean #tokens per instance, episodes, and the episodes without a
    readable answer."""
    lines = [
        "| task | method | score | scorer | mean #tokens | episodes | unread answers |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["status"] == "ok":
            scorer = _cell(r.get("scorer") or "–")
            if r.get("f1") is not None and not scorer.startswith("f1"):
                scorer += f" (F1 {r['f1']:.3f})"
            lines.append(
                f"| {r['task']} | {_cell(r['method'])} | {r['score']:.3f} | {scorer} | "
                f"{r['mean_tokens']:.1f} | {r['episodes']} | {unread_cell(r)} |"
            )
        else:
            lines.append(f"| {r['task']} | {_cell(r['method'])} | {_cell(_status(r))} | – | – | 0 | – |")
    return "\n".join(lines) + "\n"


def paper_tables(results: Mapping[str, Any]) -> str:
    """Table 1 layout: a row per method, (score, #Tok) columns per task, a table per task family."""
    rows = results["rows"]
    tasks = results["tasks"]
    methods = [m["label"] for m in results["methods"]]
    by_key = {(r["task"], r["method"]): r for r in rows}
    out = []
    families = list(dict.fromkeys(t["family"] for t in tasks))
    for family in families:
        group = [t for t in tasks if t["family"] == family]
        metrics = [t.get("metric") or metric_name(None, family) for t in group]
        header = ["Method"]
        for t, metric in zip(group, metrics):
            header += [f"{t['task']} {_cell(metric)}", "#Tok"]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for label in methods:
            cells = [_cell(label)]
            for t in group:
                r = by_key.get((t["task"], label))
                if r is None or r["status"] != "ok":
                    cells += [_cell(r["status"] if r else "not run"), "–"]
                else:
                    cells += [f"{100 * r['score']:.1f}", f"{r['mean_tokens']:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
        title = _FAMILY_TITLES.get(family, family or "tasks")
        named = " / ".join(_cell(m) for m in dict.fromkeys(metrics))
        out.append(f"**{title}** ({named} in %, #Tok = mean tokens per instance)\n\n" + "\n".join(lines))
    return "\n\n".join(out) + "\n"


def scaling_table(curves: Mapping[str, Mapping[str, Sequence[Mapping[str, float]]]]) -> str:
    """Per task and method, the vote score, coverage and total tokens at every k."""
    lines = [
        "| task | method | k | majority vote | coverage | total #tokens |",
        "|---|---|---|---|---|---|",
    ]
    for task, per_method in curves.items():
        for method, curve in per_method.items():
            for p in curve:
                lines.append(
                    f"| {task} | {_cell(method)} | {p['k']} | {p['score']:.3f} | {p['coverage']:.3f} | "
                    f"{p['tokens']:.1f} |"
                )
    return "\n".join(lines) + "\n"


def _wall_time(results: Mapping[str, Any]) -> str:
    text = f"{results['wall_time_s']} s (this invocation)"
    runs = results.get("invocations") or []
    if len(runs) > 1:
        total = round(sum(r["wall_time_s"] for r in runs), 1)
        text += (
            f"; {total} s over {len(runs)} invocations ("
            + ", ".join(
                f"{r['started']}: {r['wall_time_s']} s, {r['generated']} episodes generated" for r in runs
            )
            + ")"
        )
    return text


def _caps(settings: Mapping[str, Any]) -> str:
    """The caps every system played under, and where they came from (the suite, or the training
    run of the checkpoints; a flag overrides either)."""
    cut = ", turns cut at speaker tags" if settings.get("stop_at_speaker_tags") else ""
    source = settings.get("caps_from", "the suite")
    return f"{settings['max_turns']} turns x {settings['max_new_tokens']} tokens{cut}, from {source}"


def _provenance(results: Mapping[str, Any]) -> str:
    s = results["settings"]
    units = results["units"]
    items = [
        ("suite", results["suite"]),
        ("model", results["model"]),
        ("backend", results["backend"]),
        ("token counter", results["token_counter"]),
        ("data folder", results["data_dir"] or "(not set)"),
        ("split", results["split"]),
        ("seed", f"{s['seed']} (job seeds: crc32 of 'seed/instance/sample', optima_env.rollout.job_seed)"),
        ("git commit", results["git_commit"] or "(unknown)"),
        ("started", results["started"]),
        ("wall time", _wall_time(results)),
        ("episodes", f"{units['generated']} generated in this invocation, {units['resumed']} resumed"),
        (
            "generation",
            f"max_turns {s['max_turns']}, max_new_tokens {s['max_new_tokens']}, temperature "
            f"{s['temperature']}; SC n={s['sc_n']} at T={s['sc_temperature']}; scaling "
            f"k≤{s['scaling_k']} at T={s['scaling_temperature']}",
        ),
        ("caps", _caps(s)),
        ("task arguments", "; ".join(f"{t['task']} {t['task_kwargs']}" for t in results["tasks"]
                                     if t.get("task_kwargs")) or "none"),
        ("command", "`" + " ".join(results["command"]) + "`"),
    ]
    return "\n".join(f"- **{k}**: {v}" for k, v in items) + "\n"


def render_report(results: Mapping[str, Any], *, plots: Sequence[str], viewer: str | None) -> str:
    """The whole ``report.md``."""
    parts = [f"# Benchmark report: {results['run_name']}\n", _provenance(results)]
    parts.append("## Results (paper Table 1 layout)\n\n" + paper_tables(results))
    parts.append("## All rows\n\n" + long_table(results["rows"]))
    warnings = unread_warnings(results["rows"])
    if warnings:
        lines = "\n".join(f"- **warning**: {w}" for w in warnings)
        parts.append(f"## Unread answers\n\n{lines}\n")
    missing = [t for t in results["tasks"] if t["status"] != "ok"]
    if missing:
        parts.append(
            "## Tasks not evaluated\n\n"
            + "\n".join(f"- {t['task']}: {t['status']}: {_cell(t['reason'])}" for t in missing)
            + "\n"
        )
    if results.get("curves"):
        parts.append("## Inference scaling (spec §8.3)\n\n" + scaling_table(results["curves"]))
    if plots:
        parts.append("## Plots\n\n" + "\n\n".join(f"![{p}]({p})" for p in plots) + "\n")
    methods = "\n".join(
        f"- **{m['label']}** (`{m['key']}`): {m['prompts']}; {m['samples']} sample(s) per instance at "
        f"T={m['temperature']}; score: {_AGGREGATES.get(m['aggregate'], m['aggregate'])}; model: {m['model']}"
        for m in results["methods"]
    )
    parts.append("## Methods\n\n" + methods + "\n")
    files = ["`episodes.jsonl` (every episode, `metadata` = method / instance / sample)", "`results.json`"]
    if viewer:
        files.append(f"[`{viewer}`]({viewer}) (conversations with their reward breakdowns)")
    parts.append("## Files\n\n" + "\n".join(f"- {f}" for f in files) + "\n")
    return "\n".join(parts)
