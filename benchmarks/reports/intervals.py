"""95% bootstrap intervals on the rows of a run, and their ratios to a base row (MAD).

:func:`add_intervals` works on :func:`benchmarks.evaluation.outputs.collect_results` rows, which keep every
instance's score and tokens (``instance_scores``, ``instance_tokens``); the ratios are paired: one
resample draws the same instances for the row and its base. :func:`ratio_table` is the table the
main command prints; the demo report uses the same cells (:func:`cell`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.reports.stats import bootstrap_mean, bootstrap_ratio

__all__ = ["add_intervals", "cell", "ratio_table"]


def _bounds(iv: Any) -> list[float] | None:
    if iv is None or getattr(iv, "low", None) is None:
        return None
    return [round(float(iv.low), 4), round(float(iv.high), 4)]


def add_intervals(rows: Sequence[dict[str, Any]], *, base_key: str = "mad") -> None:
    """Add ``score_ci``, ``tokens_ci`` and, against the row of ``base_key`` on the same task,
    ``score_ratio``/``token_ratio`` with their ``*_ci`` to every row (in place)."""
    bases = {r["task"]: r for r in rows if r.get("method_key") == base_key and r.get("instance_scores")}
    for row in rows:
        scores, tokens = row.get("instance_scores") or [], row.get("instance_tokens") or []
        row["score_ci"] = _bounds(bootstrap_mean(scores)) if scores else None
        row["tokens_ci"] = _bounds(bootstrap_mean(tokens)) if tokens else None
        base = bases.get(row.get("task"))
        if base is None or len(base["instance_scores"]) != len(scores) or not scores:
            continue
        for name, num, den in (
            ("score_ratio", scores, base["instance_scores"]),
            ("token_ratio", tokens, base["instance_tokens"]),
        ):
            iv = bootstrap_ratio(num, den, paired=True)  # estimate None: the base's mean is 0
            row[name] = iv.estimate
            row[f"{name}_ci"] = _bounds(iv)


def cell(value: Any, ci: Any = None, digits: int = 3, suffix: str = "") -> str:
    """``value [low, high]`` (``–`` when there is no value)."""
    if value is None:
        return "–"
    text = f"{value:.{digits}f}{suffix}"
    return f"{text} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else text


def ratio_table(rows: Sequence[Mapping[str, Any]], *, base_label: str = "MAD") -> str:
    """Markdown table: every row's score and tokens with intervals and the ratios to the base."""
    lines = [
        f"| Task | System | Score (95% CI) | Tokens / episode (95% CI) | Score vs {base_label} "
        f"| Tokens vs {base_label} |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['task']} | {row['method']} | {cell(row.get('score'), row.get('score_ci'))} | "
            f"{cell(row.get('mean_tokens'), row.get('tokens_ci'), 1)} | "
            f"{cell(row.get('score_ratio'), row.get('score_ratio_ci'), 2, 'x')} | "
            f"{cell(row.get('token_ratio'), row.get('token_ratio_ci'), 2, 'x')} |"
        )
    return "\n".join(lines)
