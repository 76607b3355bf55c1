"""PNG plots of a run (matplotlib, Agg backend): score against tokens, and the scaling curves.

matplotlib is imported inside the functions (it comes with the ``train`` extra).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from optima_env.errors import require

__all__ = ["plot_scaling", "plot_score_vs_tokens"]


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _pyplot() -> Any:
    matplotlib = require("matplotlib", "train")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(plt: Any, rows: int, cols: int) -> tuple[Any, Any]:
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.8 * rows), squeeze=False)
    return fig, axes


def _unit_scale(ax: Any) -> None:
    """A panel of scores in [0, 1], gridded, with its legend."""
    ax.set_ylim(-0.05, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="best")


def _save(plt: Any, fig: Any, title: str, path: str | Path) -> bool:
    """Title ``fig``, write it to ``path`` as a PNG and close it; True (something was plotted)."""
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _log_if_wide(ax: Any, values: Sequence[float]) -> None:
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 20:
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())


def plot_score_vs_tokens(rows: Sequence[Mapping[str, Any]], path: str | Path) -> bool:
    """One panel per task: a point per method at (mean #tokens, score). False if nothing to plot."""
    ok = [r for r in rows if r["status"] == "ok"]
    tasks = list(dict.fromkeys(r["task"] for r in ok))
    if not tasks:
        return False
    plt = _pyplot()
    fig, axes = _grid(plt, 1, len(tasks))
    for ax, task in zip(axes[0], tasks):
        points = [r for r in ok if r["task"] == task]
        for i, r in enumerate(points):
            ax.scatter(
                [r["mean_tokens"]],
                [r["score"]],
                s=80 - 6 * (i % 8),
                color=f"C{i % 10}",
                marker=_MARKERS[i % len(_MARKERS)],
                label=r["method"],
                zorder=3,
                alpha=0.85,
            )
        _log_if_wide(ax, [r["mean_tokens"] for r in points])
        ax.set_title(task)
        ax.set_xlabel("mean #tokens per instance")
        ax.set_ylabel("score (F1 / accuracy)")
        _unit_scale(ax)
    return _save(plt, fig, "Score against tokens", path)


def plot_scaling(curves: Mapping[str, Mapping[str, Sequence[Mapping[str, float]]]], path: str | Path) -> bool:
    """A row per task: majority-vote score (left) and coverage (right) against total tokens, per method."""
    tasks = [t for t, per_method in curves.items() if per_method]
    if not tasks:
        return False
    plt = _pyplot()
    fig, axes = _grid(plt, len(tasks), 2)
    for row, task in enumerate(tasks):
        for i, (method, curve) in enumerate(curves[task].items()):
            tokens = [p["tokens"] for p in curve]
            for col, key in enumerate(("score", "coverage")):
                axes[row][col].plot(
                    tokens,
                    [p[key] for p in curve],
                    marker=_MARKERS[i % len(_MARKERS)],
                    color=f"C{i % 10}",
                    label=method,
                )
        for col, name in enumerate(("majority-vote score", "coverage (best of k)")):
            ax = axes[row][col]
            _log_if_wide(ax, [p["tokens"] for c in curves[task].values() for p in c])
            ax.set_title(f"{task}: {name}")
            ax.set_xlabel("total #tokens per instance (k samples)")
            ax.set_ylabel(name)
            _unit_scale(ax)
    return _save(plt, fig, "Inference scaling (k = 1..K samples)", path)
