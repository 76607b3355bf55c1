"""The demo's plots: the held-out score and tokens per stage of every run, and the inference-scaling
curves (:mod:`benchmarks.demo.suite` calls :func:`write_plots` with :mod:`benchmarks.demo.report`'s
summary of a task)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["write_plots"]


def write_plots(summary: Mapping[str, Any], out: Path) -> list[str]:
    """``demo_<task>.png`` (held-out score and tokens per stage of every run) and, with scaling
    curves, ``demo_<task>_scaling.png`` (majority-vote score and coverage vs samples and vs tokens, as
    the paper's figure); returns the file names."""
    from benchmarks.reports.plots import _pyplot

    names: list[str] = []
    rows = {r["key"]: r for r in summary.get("stage_rows", [])}  # the instances of the curves
    if summary.get("curves"):
        plt = _pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for ax, key, title in ((axes[0], "score", "held-out score"), (axes[1], "tokens", "tokens / episode")):
            for i, (run, points) in enumerate(summary["curves"].items()):
                ys = [p[key] for p in points]
                ax.plot(range(len(ys)), ys, marker="o", color=f"C{i}", label=run)
            for base, style in (("mad", "--"), ("cot", ":")):
                if base in rows and rows[base][key] is not None:
                    ax.axhline(rows[base][key], color="gray", linestyle=style, label=rows[base]["method"])
            ax.set_xlabel("stage (0 = initialization)")
            ax.set_title(f"{summary['task']}: {title}")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        name = f"demo_{summary['name']}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    if summary.get("scaling"):
        plt = _pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
        for i, (method, curve) in enumerate(summary["scaling"].items()):
            xs = (list(range(1, len(curve) + 1)), [p["tokens"] for p in curve])
            for ax, x in zip(axes, xs, strict=True):  # majority vote solid, coverage (best of k) dashed
                ax.plot(
                    x,
                    [p["score"] for p in curve],
                    marker="o",
                    color=f"C{i}",
                    label=f"{method}: majority vote",
                )
                ax.plot(
                    x,
                    [p["coverage"] for p in curve],
                    "--",
                    marker="^",
                    color=f"C{i}",
                    label=f"{method}: coverage",
                )
        axes[0].set_xlabel("samples per instance (k)")
        axes[1].set_xlabel("tokens per instance (k samples)")
        axes[1].set_xscale("log")
        for ax in axes:
            ax.set_ylabel("score")
            ax.grid(alpha=0.3)
        fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8)
        fig.suptitle(f"{summary['task']}: inference scaling (T=0.5)")
        fig.tight_layout(rect=(0, 0.14, 1, 1))
        name = f"demo_{summary['name']}_scaling.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names
