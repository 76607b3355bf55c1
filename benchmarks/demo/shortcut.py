"""The demo's check of a task with controls: do the trained systems score by passing the evidence
on, or by something a shortcut reaches too?

Measured on the table's rows (:mod:`benchmarks.evaluation.controls` adds the counterfactuals'
paired differences, the summary the computed ceiling):

* the best trained system at least :data:`MIN_SCORE` and at least the ceiling + :data:`MIN_MARGIN`;
* its counterfactual at most the ceiling + :data:`MAX_COUNTERFACTUAL_MARGIN`, with a paired drop whose
  95% interval lies above :data:`MIN_DROP`;
* at most :data:`MAX_TOKENS` tokens per episode, and a score above CoT's and MAD's on the same metric.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.demo.control import MAX_TOKENS

__all__ = ["MAX_COUNTERFACTUAL_MARGIN", "MIN_DROP", "MIN_MARGIN", "MIN_SCORE", "shortcut_lines"]

MIN_SCORE = 0.6
MIN_MARGIN = 0.4
MAX_COUNTERFACTUAL_MARGIN = 0.1
MIN_DROP = 0.3


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def shortcut_lines(summary: Mapping[str, Any]) -> list[str]:
    """The report's lines: each part of the check, measured, met or not."""
    ceiling = summary["ceiling"]
    rows = summary.get("rows", [])
    by_key = {r["key"]: r for r in rows}
    lines = [f"Check against the controls (shortcut ceiling {ceiling:.3f}):", ""]
    one_hand = by_key.get("one_hand")
    if one_hand is not None and one_hand.get("score") is not None:
        lines.append(f"- one hand alone (the untrained model with the final-hop holder's evidence): "
                     f"{one_hand['score']:.3f}")  # fmt: skip
    finals = [r for r in rows if r.get("final_of") and r.get("score") is not None]
    if not finals:
        return [*lines, "- no trained system in this table yet", ""]
    best = max(finals, key=lambda r: r["score"])
    name = best["final_of"]
    wanted = max(MIN_SCORE, ceiling + MIN_MARGIN)
    lines.append(f"- the best trained system, {name}: {best['score']:.3f} "
                 f"({_verdict(best['score'] >= wanted)}, at least {wanted:.3f} wanted)")  # fmt: skip
    cf = by_key.get(f"cf:{best['key']}")
    if cf is None or cf.get("score") is None:
        lines.append(f"- {name}'s counterfactual: not played")
    else:
        ci = cf.get("score_vs_system_ci")
        drop_ok = ci is not None and -ci[1] > MIN_DROP
        limit = ceiling + MAX_COUNTERFACTUAL_MARGIN
        lines.append(f"- {name} with Alice's evidence from another instance: {cf['score']:.3f} "
                     f"({_verdict(cf['score'] <= limit)}, at most {limit:.3f} wanted)")  # fmt: skip
        shown = "–" if ci is None else f"{-cf['score_vs_system']:.3f} [{-ci[1]:.3f}, {-ci[0]:.3f}]"
        lines.append(f"- its paired drop: {shown} ({_verdict(drop_ok)}, interval above {MIN_DROP:g} wanted)")
    tokens = best.get("tokens")
    if tokens is not None:
        lines.append(f"- {name}'s tokens per episode: {tokens:.1f} "
                     f"({_verdict(tokens <= MAX_TOKENS)}, at most {MAX_TOKENS:g} wanted)")  # fmt: skip
    for key, label in (("cot", "CoT"), ("mad", "MAD")):
        base = by_key.get(key)
        if base is not None and base.get("score") is not None:
            lines.append(f"- above {label} ({base['score']:.3f}): {_verdict(best['score'] > base['score'])}")
    return [*lines, ""]
