"""The demo's control: M_0, the shared initialization (the iteration-0 stage, spec §4), in
every table, and the paired difference of every row against it with its 95% bootstrap interval.

iDPO and iSFT-DPO start from M_0, so a stage or an adapter has learned something only where it
beats M_0 on the same instances; a ratio to MAD cannot tell that. :func:`add_control` works on
:func:`benchmarks.evaluation.outputs.collect_results` rows (which keep every instance's score and tokens, in
instance order): per row, the difference of its mean score (and tokens) minus M_0's over the same
instances, with the paired percentile bootstrap interval of
:func:`benchmarks.reports.stats.bootstrap_difference` (one resample draws the same instances for both).
A table without M_0's episodes gets no difference, and the reason, which the report prints in
place of the missing row (never a silent omission).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.demo.tasks import stage_label
from benchmarks.reports.stats import bootstrap_difference, wilson_interval

__all__ = [
    "CONTROL",
    "MAX_TOKENS",
    "MIN_PAIRS",
    "MIN_PAIR_ACCURACY",
    "add_control",
    "control_label",
    "diff_cell",
    "learning_lines",
    "missing_line",
]

CONTROL = "M_0"
"""The name the report gives the control row."""


def control_label(runs: Sequence[Any]) -> str | None:
    """The row label of M_0: the first stage of the first run that trained it itself (the others
    adopted it: their ``shared`` names it), or None without runs."""
    owner = next((r for r in runs if r.stages and getattr(r, "shared", None) != r.stages[0][0]), None)
    return None if owner is None else stage_label(owner.trainer, owner.stages[0][0])


def _bounds(low: float | None, high: float | None) -> list[float] | None:
    return None if low is None or high is None else [round(low, 4), round(high, 4)]


def add_control(rows: Sequence[dict[str, Any]], label: str | None) -> str | None:
    """Mark M_0's row (``control: True``) and add to every other row with per-instance values, in
    place, ``score_vs_m0`` and ``tokens_vs_m0`` (its mean minus M_0's, paired over the same
    instances) with their 95% intervals (``*_ci``).

    Returns:
        None when M_0's row is there, else why not (the report prints it): no M_0 for these runs,
        or no episodes of it in this table's store.
    """
    if label is None:
        return f"no {CONTROL} row: these runs have no initialization stage"
    control = next((r for r in rows if r.get("method") == label), None)
    if control is None or not control.get("instance_scores"):
        return (
            f"{CONTROL} ({label}, the shared initialization) is missing from this table: its episodes "
            "on these instances are not in the store (they need its checkpoint, which only a run with "
            "the training folders has), so no row is compared with it"
        )
    base_scores, base_tokens = control["instance_scores"], control["instance_tokens"]
    for row in rows:
        row["control"] = row is control
        scores, tokens = row.get("instance_scores"), row.get("instance_tokens")
        if row is control or not scores or len(scores) != len(base_scores):
            continue
        for name, values, base in (
            ("score_vs_m0", scores, base_scores),
            ("tokens_vs_m0", tokens, base_tokens),
        ):
            iv = bootstrap_difference(values, base)
            row[name], row[f"{name}_ci"] = iv.estimate, _bounds(iv.low, iv.high)
    return None


def missing_line(summary: Mapping[str, Any], *, stages: bool = False) -> str:
    """The report's line for a table without M_0 (empty when it has one)."""
    reason = (summary.get("control_missing") or {}).get("stages" if stages else "table")
    return f"**{CONTROL} missing**: {reason}." if reason else ""


def diff_cell(value: float | None, ci: Sequence[float] | None, digits: int) -> str:
    """A signed difference and its interval, ``+0.053 [+0.010, +0.095]`` (``–`` without one).

    >>> diff_cell(0.0531, [-0.0104, 0.0952], 3), diff_cell(None, None, 3)
    ('+0.053 [-0.010, +0.095]', '–')
    """
    if value is None:
        return "–"
    text = f"{value:+.{digits}f}"
    return f"{text} [{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]" if ci else text


MIN_PAIRS = 100
"""Issue 31's target: kept preference pairs per DPO stage, at least."""
MIN_PAIR_ACCURACY = 0.65
"""Issue 31's target: held-out pair accuracy of every DPO stage, at least."""
MAX_TOKENS = 40.0
"""Issue 31's target: tokens per episode of the best trained system, at most (the paper's trained
systems use 36-67 on the information-exchange tasks)."""


def _accuracy(accuracy: float | None, held_out: float | None) -> str:
    """A held-out pair accuracy with its count and 95% Wilson interval: a stage holds out 10% of its
    pairs (about 10 to 25 here), so the interval says how far the number is from the 0.65 line.

    >>> _accuracy(0.7, 10.0), _accuracy(0.7, None), _accuracy(None, 0.0)
    ('0.70 (7 of 10, 95% interval 0.40-0.89)', '0.70', 'not evaluated')
    """
    if accuracy is None:
        return "not evaluated"
    if not held_out:  # records before the count was kept
        return f"{accuracy:.2f}"
    n = int(held_out)
    k = round(accuracy * n)  # one pair a batch: the accuracy is k/n
    low, high = wilson_interval(k, n)
    return f"{accuracy:.2f} ({k} of {n}, 95% interval {low:.2f}-{high:.2f})"


def learning_lines(summary: Mapping[str, Any]) -> list[str]:
    """The report's check that the preference-trained runs learned (issue 31), each part measured:
    every final adapter of a run with DPO stages against M_0 (paired 95% interval above 0), and
    each DPO stage's kept pairs and held-out pair accuracy. Empty for a task without DPO stages."""
    dpo_runs = {
        run: [p for p in points if p.get("pairs") is not None and not p.get("shared")]
        for run, points in (summary.get("curves") or {}).items()
    }
    dpo_runs = {run: points for run, points in dpo_runs.items() if points}
    if not dpo_runs:
        return []
    finals = {r.get("final_of"): r for r in summary.get("rows", []) if r.get("final_of")}
    lines = [f"Learning check (issue 31): each preference-trained run's adapter against {CONTROL}, and "
             f"its DPO stages (at least {MIN_PAIRS} kept pairs, held-out pair accuracy at least "
             f"{MIN_PAIR_ACCURACY}):", ""]  # fmt: skip
    for run, points in dpo_runs.items():
        row = finals.get(run) or {}
        ci = row.get("score_vs_m0_ci")
        beats = ci is not None and ci[0] > 0
        verdict = "no row" if not row else ("met" if beats else "not met")
        lines.append(
            f"- {run}: adapter vs {CONTROL} {diff_cell(row.get('score_vs_m0'), ci, 3)} ({verdict}, "
            "interval above 0 wanted)"
        )
        for p in points:
            pairs, accuracy = p.get("pairs"), p.get("pair_accuracy")
            ok = pairs >= MIN_PAIRS and accuracy is not None and accuracy >= MIN_PAIR_ACCURACY
            shown = _accuracy(accuracy, p.get("eval_pairs"))
            gaps = ", ".join(f"{term} {gap:+.3f}" for term, gap in (p.get("pair_gaps") or {}).items())
            verdict = "met" if ok else "not met"
            lines.append(
                f"  - {p['stage']}: {pairs:g} pairs, held-out pair accuracy {shown} ({verdict})"
                + (f"; mean gap chosen - rejected: {gaps}" if gaps else "")
            )
    best = max(finals.values(), key=lambda r: r.get("score") or 0.0, default=None)
    if best is not None and best.get("tokens") is not None:
        fits = best["tokens"] <= MAX_TOKENS
        lines.append(
            f"- the best trained system ({best['final_of']}): {best['tokens']:.1f} tokens per episode "
            f"({'met' if fits else 'not met'}, at most {MAX_TOKENS:g} wanted)"
        )
    return [*lines, ""]
