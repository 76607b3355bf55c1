"""The controls of a table: what a system would score without the ability it claims.

A trained 2-agent system scores well on an information-exchange task either because its agents
pass the evidence on or because something else in the instance gives the answer away. Three
controls tell the two apart, each beside the systems on the same instances and metric:

* **shortcut ceiling**: computed, not played: the best expected score of any strategy that never
  passes the bridging evidence on (the task's ``ceiling()``; ``ie/synth-v1``: 1/K);
* **one hand** (``--methods one-hand``): the untrained model alone with only the final-hop
  holder's evidence, the same caps: what one hand answers without the other;
* **counterfactual** (:func:`benchmarks.evaluation.methods.counterfactual`): each trained system
  again with its first agent's private evidence taken from another instance. A system that
  communicates falls to the ceiling there; one that learned a shortcut keeps its score. Its row
  carries the paired difference against the system itself with a 95% bootstrap interval.

:func:`add_controls` adds them to a run's results (``results["controls"]``); :func:`controls_table`
prints them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.reports.stats import bootstrap_difference

__all__ = ["CEILING_LABEL", "add_controls", "controls_table", "has_controls", "task_ceiling"]

CEILING_LABEL = "Shortcut ceiling (computed: no bridging evidence passed on)"


def has_controls(task: Any) -> bool:
    """Whether the task can play every control: it deals private evidence and can swap it
    (``swap_evidence(sample, donor, agent)``)."""
    return callable(getattr(task, "swap_evidence", None))


def task_ceiling(task: Any) -> float | None:
    """The task's shortcut ceiling (its ``ceiling()``), or None when it states none."""
    ceiling = getattr(task, "ceiling", None)
    return float(ceiling()) if callable(ceiling) else None


def _bounds(low: float | None, high: float | None) -> list[float] | None:
    return None if low is None or high is None else [round(low, 4), round(high, 4)]


def add_controls(results: dict[str, Any], entries: Sequence[Any]) -> dict[str, Any]:
    """Add ``results["controls"]``: per task, its computed ceiling, and per counterfactual row
    (``method_key`` ``cf:<key>``) the paired difference of its scores minus its system's
    (``score_vs_system`` with its interval ``score_vs_system_ci``, set on the row itself)."""
    by_key = {(r["task"], r["method_key"]): r for r in results["rows"]}
    pairs = []
    for row in results["rows"]:
        if not row["method_key"].startswith("cf:"):
            continue
        system = by_key.get((row["task"], row["method_key"][3:]))
        scores, base = row.get("instance_scores"), (system or {}).get("instance_scores")
        if not scores or not base or len(scores) != len(base):
            continue
        iv = bootstrap_difference(scores, base)
        row["score_vs_system"], row["score_vs_system_ci"] = iv.estimate, _bounds(iv.low, iv.high)
        pairs.append({"task": row["task"], "system": system["method"], "counterfactual": row["method"],
                      "system_score": system["score"], "score": row["score"],
                      "difference": iv.estimate, "difference_ci": row["score_vs_system_ci"]})  # fmt: skip
    ceilings = {e.task: task_ceiling(e.obj) for e in entries if e.obj is not None}
    results["controls"] = {
        "ceilings": {task: c for task, c in ceilings.items() if c is not None},
        "counterfactuals": pairs,
    }
    return results["controls"]


def _cell(value: float | None, ci: Sequence[float] | None) -> str:
    if value is None:
        return "–"
    return f"{value:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")


def controls_table(results: Mapping[str, Any]) -> str:
    """The controls as a Markdown table: the ceiling, the one-hand row, and each system against
    its counterfactual (empty when the run has none)."""
    controls = results.get("controls") or {}
    lines = []
    for task, ceiling in controls.get("ceilings", {}).items():
        lines.append(f"| {task} | {CEILING_LABEL} | {ceiling:.3f} | – |")
    for row in results["rows"]:
        if row["method_key"] == "one_hand" and row.get("score") is not None:
            lines.append(f"| {row['task']} | {row['method']} | {row['score']:.3f} | – |")
    for pair in controls.get("counterfactuals", []):
        lines.append(
            f"| {pair['task']} | {pair['counterfactual']} (the system: {pair['system_score']:.3f}) | "
            f"{pair['score']:.3f} | {_cell(pair['difference'], pair['difference_ci'])} |"
        )
    if not lines:
        return ""
    head = ["| Task | Control | Score | Counterfactual − system (95% CI) |", "|---|---|---|---|"]
    return "\n".join(head + lines)
