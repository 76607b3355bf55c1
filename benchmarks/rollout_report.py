"""Tables and plots of the rollout throughput suite (:mod:`benchmarks.rollout_bench`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot", "summarize"]

_RATIOS = (("tokens_per_s", "wall"), ("tokens_per_cpu_s", "cpu"), ("episodes_per_s", "episodes"))


def summarize(cfg: dict[str, Any], results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Rows with ratios to the naive loop, the two targets, and the Markdown table.

    Ratios come on wall-clock time and on CPU time (user + system of the phase's processes): on a
    machine shared with other work, the CPU-time ratio is the steadier of the two.
    """
    naive = results.get("naive", {})
    rows = []
    for name, r in results.items():
        row = {"phase": name, **r}
        if name != "roofline":
            for key, label in _RATIOS:
                if naive.get(key) and r.get(key):
                    row[f"x_naive_{label}"] = r[key] / naive[key]
        rows.append(row)
    engine, vllm = results.get("engine", {}), results.get("vllm", {})

    def ratio(a: dict[str, Any], b: dict[str, Any], key: str) -> float | None:
        return a[key] / b[key] if a.get(key) and b.get(key) else None

    targets = {
        "engine_vs_naive": ratio(engine, naive, "tokens_per_s"),
        "engine_vs_naive_cpu": ratio(engine, naive, "tokens_per_cpu_s"),
        "engine_vs_naive_target": 10.0,
        "engine_vs_vllm": ratio(engine, vllm, "tokens_per_s"),
        "engine_vs_vllm_cpu": ratio(engine, vllm, "tokens_per_cpu_s"),
        "engine_vs_vllm_target": 1.0,
    }
    return {"config": cfg, "phases": rows, "targets": targets, "table": _table(cfg, rows, targets)}


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "" if value is None else format(value, spec)


def _table(c: dict[str, Any], rows: list[dict[str, Any]], targets: dict[str, Any]) -> str:
    lines = [
        f"Rollout throughput: {c['model']} on {c['task']} ({c['split']}), {c['episodes']} episodes "
        f"({c['samples']} samples per instance), concurrency {c['concurrency']}, "
        f"max {c['max_turns']} turns, {c['max_new_tokens']} new tokens per turn (fixed), "
        f"T={c['temperature']}, {c['threads']} threads.",
        "",
        "| phase | backend | episodes | turns | tokens/s | tokens/CPU-s | episodes/s | x naive tok/s "
        "| x naive tok/CPU-s | x naive ep/s | start-up s | peak RSS GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['phase']} | skipped: {r['skipped']} |" + "  |" * 10)
            continue
        if r["phase"] == "roofline":
            continue
        lines.append(
            f"| {r['phase']} | {r.get('backend', '')} | {r.get('episodes', '')} | {r.get('turns', '')} "
            f"| {_fmt(r.get('tokens_per_s'))} | {_fmt(r.get('tokens_per_cpu_s'))} "
            f"| {_fmt(r.get('episodes_per_s'), '.3f')} | {_fmt(r.get('x_naive_wall'))} "
            f"| {_fmt(r.get('x_naive_cpu'))} | {_fmt(r.get('x_naive_episodes'))} "
            f"| {_fmt(r.get('startup_s'))} | {_fmt(r.get('peak_rss_gb'), '.2f')} |"
        )
    roof = next((r for r in rows if r["phase"] == "roofline" and "tokens_per_s" in r), None)
    if roof:
        lines += [
            "",
            f"Decode roofline (forward passes only, batch {roof['batch']}, KV cache of {roof['context']} "
            f"tokens): {_fmt(roof['tokens_per_s'])} tok/s ({_fmt(roof.get('tokens_per_cpu_s'))} per "
            "CPU-s) with the engine's KV buffer and attention, "
            f"{_fmt(roof['tokens_per_s_transformers_default'])} tok/s "
            f"({_fmt(roof.get('tokens_per_cpu_s_transformers_default'))} per CPU-s) with transformers' "
            f"default cache and attention (peak RSS {_fmt(roof.get('peak_rss_gb'), '.2f')} GB).",
        ]
    lines += [
        "",
        f"Targets: engine / naive = {_fmt(targets['engine_vs_naive'])} on wall-clock time, "
        f"{_fmt(targets['engine_vs_naive_cpu'])} on CPU time (target >= 10); engine / vLLM = "
        f"{_fmt(targets['engine_vs_vllm'], '.2f')} on wall-clock time, "
        f"{_fmt(targets['engine_vs_vllm_cpu'], '.2f')} on CPU time (target >= 1).",
    ]
    return "\n".join(lines) + "\n"


def plot(path: Path, summary: dict[str, Any]) -> None:
    """A bar chart of generated tokens per second by phase (skipped without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the train extra
        return
    rows = [r for r in summary["phases"] if r.get("tokens_per_s")]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh([r["phase"] for r in rows], [r["tokens_per_s"] for r in rows])
    ax.set_xlabel("generated tokens / s (wall clock)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
