"""Tables and plots of the rollout throughput suite (:mod:`benchmarks.throughput.rollout_bench`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.throughput.rollout_drivers import EOS_PHASES
from benchmarks.throughput.rollout_engines import ENGINE_PHASES, engines_text
from benchmarks.throughput.rollout_eos_report import eos_table, eos_targets
from benchmarks.throughput.rollout_eos_report import fmt as _fmt
from benchmarks.throughput.rollout_eos_report import pct as _pct
from benchmarks.throughput.rollout_floor import ATTENTION_COLUMNS, floor_of

__all__ = ["plot", "summarize"]

_RATIOS = (("tokens_per_s", "wall"), ("tokens_per_cpu_s", "cpu"), ("episodes_per_s", "episodes"))


def summarize(cfg: dict[str, Any], results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Rows with ratios to the naive loop and shares of the GEMM limit, the targets, and the table.

    Ratios come on wall-clock time and on CPU time (user + system of the phase's processes): on a
    machine shared with other work, the CPU-time ratio is the steadier of the two. A row's
    ``of_gemm_limit`` is its tokens/s over the fp32 GEMM-bound rate at its batch size (the
    ``gemm`` phase, measured in the same run; the nearest batch measured when its own is not).
    """
    naive = results.get("naive", {})
    limits = results.get("gemm", {}).get("limits", {})
    floor = results.get("floor") if "units" in results.get("floor", {}) else None
    rows = []
    for name, r in results.items():
        row = {"phase": name, **r}
        if floor and "engines" in r:
            row["engines"] = {k: {**e, **_floor(e, cfg["eos_threads"], floor)} for k, e in r["engines"].items()}
        if name in (*EOS_PHASES, *ENGINE_PHASES):
            rows.append(row)
            continue
        if floor:
            row.update(_floor(r, cfg["threads"], floor))
        if name not in ("roofline", "gemm"):
            for key, label in _RATIOS:
                if naive.get(key) and r.get(key):
                    row[f"x_naive_{label}"] = r[key] / naive[key]
            limit = _limit_at(limits, r.get("batch"))
            if limit and r.get("tokens_per_s"):
                row["of_gemm_limit"] = r["tokens_per_s"] / limit
        rows.append(row)
    engine, vllm = results.get("engine", {}), results.get("vllm", {})

    def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str) -> float | None:
        return a[key] / b[key] if a and b and a.get(key) and b.get(key) else None

    targets = {
        "engine_vs_naive": ratio(engine, naive, "tokens_per_s"),
        "engine_vs_naive_cpu": ratio(engine, naive, "tokens_per_cpu_s"),
        "engine_vs_naive_target": 10.0,
        "engine_vs_vllm": ratio(engine, vllm, "tokens_per_s"),
        "engine_vs_vllm_cpu": ratio(engine, vllm, "tokens_per_cpu_s"),
        "engine_vs_vllm_target": 1.0,
        **eos_targets(results),
    }
    fixed = [r for r in rows if r["phase"] not in (*EOS_PHASES, *ENGINE_PHASES)]
    table = (_table(cfg, fixed, targets) if fixed else "") + eos_table(cfg, results, targets)
    engines = engines_text({r['phase']: r for r in rows})
    table += ("\n" + engines) if engines else ""
    return {"config": cfg, "phases": rows, "targets": targets, "table": table}


def _floor(row: dict[str, Any], threads: int, floor: dict[str, Any]) -> dict[str, Any]:
    """``floor`` (its parts, :func:`~benchmarks.throughput.rollout_floor.floor_of`) and ``of_floor``
    (floor seconds over measured seconds) of a row that recorded the engine's counters."""
    if not row.get("stats") or not row.get("seconds"):
        return {}
    parts = floor_of(row["stats"], row.get("engine", {}), row.get("threads", threads), floor)
    return {"floor": parts, "of_floor": parts["floor_s"] / row["seconds"]} if parts else {}


def _limit_at(limits: dict[str, Any], batch: Any) -> float | None:
    if not limits or not isinstance(batch, int):
        return None
    nearest = min(limits, key=lambda b: abs(int(b) - batch))
    return limits[nearest]["tokens_per_s"]


def _table(c: dict[str, Any], rows: list[dict[str, Any]], targets: dict[str, Any]) -> str:
    lines = [
        f"Rollout throughput: {c['model']} on {c['task']} ({c['split']}), {c['episodes']} episodes "
        f"({c['samples']} samples per instance), concurrency {c['concurrency']} (or the phase's _b<N>), "
        f"max {c['max_turns']} turns, {c['max_new_tokens']} new tokens per turn (fixed), "
        f"T={c['temperature']}, {c['threads']} threads.",
        "",
        "| phase | backend | batch | episodes | turns | tokens/s | tokens/CPU-s | episodes/s | x naive tok/s "
        "| x naive tok/CPU-s | x naive ep/s | of GEMM limit | of floor | start-up s | peak RSS GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["phase"] in EOS_PHASES:
            continue
        if "skipped" in r:
            lines.append(f"| {r['phase']} | skipped: {r['skipped']} |" + "  |" * 13)
            continue
        if r["phase"] in ("roofline", "gemm", "floor"):
            continue
        lines.append(
            f"| {r['phase']} | {r.get('backend', '')} | {r.get('batch', '')} | {r.get('episodes', '')} "
            f"| {r.get('turns', '')} | {_fmt(r.get('tokens_per_s'))} | {_fmt(r.get('tokens_per_cpu_s'))} "
            f"| {_fmt(r.get('episodes_per_s'), '.3f')} | {_fmt(r.get('x_naive_wall'))} "
            f"| {_fmt(r.get('x_naive_cpu'))} | {_fmt(r.get('x_naive_episodes'))} "
            f"| {_pct(r.get('of_gemm_limit'))} | {_pct(r.get('of_floor'))} | {_fmt(r.get('startup_s'))} "
            f"| {_fmt(r.get('peak_rss_gb'), '.2f')} |"
        )
    gemm = next((r for r in rows if r["phase"] == "gemm" and "limits" in r), None)
    if gemm:
        limits = ", ".join(
            f"batch {b}: {_fmt(v['tokens_per_s'])} tok/s ({_fmt(v['gflops'])} GFLOP/s)"
            for b, v in sorted(gemm["limits"].items(), key=lambda kv: int(kv[0]))
        )
        lines += [
            "",
            f"GEMM-bound limit (fp32 torch matmuls on the model's shapes, "
            f"{gemm['params_per_token'] / 1e6:.1f}M parameters per token): {limits}.",
        ]
    lines += _floor_lines(rows)
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
    t = targets
    lines += [
        "",
        f"Targets: engine / naive = {_fmt(t['engine_vs_naive'])} on wall-clock time, "
        f"{_fmt(t['engine_vs_naive_cpu'])} on CPU time (target >= 10); engine / vLLM = "
        f"{_fmt(t['engine_vs_vllm'], '.2f')} on wall-clock time, "
        f"{_fmt(t['engine_vs_vllm_cpu'], '.2f')} on CPU time (target >= 1).",
    ]
    return "\n".join(lines) + "\n"


def _floor_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The floor's note, each row's floor, and the attention kernel's timings (none without them)."""
    lines = []
    floors = [r for r in rows if r.get("floor")]
    if floors:
        lines += ["", _FLOOR_NOTE] + [f"- {r['phase']}: {floor_text(r['floor'])}." for r in floors]
    units = next((r["units"] for r in rows if r["phase"] == "floor" and "units" in r), None)
    if units and any("attention_layer_s" in u for u in units.values()):
        lines += ["", attention_text(units)]
    return lines


_FLOOR_NOTE = (
    "Two limits, which say different things. *of GEMM limit*: tokens/s over the rate of the fp32 "
    "decode GEMMs alone (each linear shape timed alone; prefill, attention and sampling left out), so "
    "it understates what a row achieves. *of floor*: the least time the row's own counted work could "
    "take (`benchmarks/throughput/rollout_floor.py`: decode and prefill GEMMs on the real weights in "
    "the row's precision, attention over the unpadded KV columns at the measured memory read rate, "
    "the row's sampler; everything else counted as zero) over its measured time. The floor's parts:"
)


def floor_text(floor: dict[str, Any]) -> str:
    """One line of a floor's rate and parts."""
    return (
        f"floor {_fmt(floor['floor_tokens_per_s'])} tok/s = decode GEMMs {_fmt(floor['decode_gemm_s'])} s "
        f"+ prefill GEMMs {_fmt(floor['prefill_gemm_s'])} s + attention {_fmt(floor['attention_s'])} s "
        f"+ sampling {_fmt(floor['sampling_s'])} s"
    )


def attention_text(units: dict[str, Any]) -> str:
    """The ``floor`` phase's timings of the attention kernel alone, fp32 against bf16 KV states."""
    timings = []
    for threads, per in sorted(units.items()):
        layer = per.get("attention_layer_s")
        if not layer:
            continue
        for batch in sorted(layer["float32"], key=int):
            fp32, bf16 = layer["float32"][batch], layer["bfloat16"][batch]
            timings.append(
                f"{threads} thread(s), batch {batch}: fp32 {fp32 * 1e3:.2f} ms, bf16 {bf16 * 1e3:.2f} ms "
                f"({bf16 / fp32:.2f}x)"
            )
    return (
        f"Attention kernel alone (one layer of a decode step over {ATTENTION_COLUMNS} KV columns, "
        "grouped KV heads; why the engine keeps its KV cache in fp32): " + "; ".join(timings) + "."
    )


def plot(path: Path, summary: dict[str, Any]) -> None:
    """A bar chart of generated tokens per second by phase, and ``drivers.png`` beside it for the
    EOS workload's drivers (skipped without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the train extra
        return
    rows = [r for r in summary["phases"] if r.get("tokens_per_s") and r["phase"] not in EOS_PHASES]
    fig, ax = plt.subplots(figsize=(6, 1 + 0.3 * len(rows)))
    ax.barh([r["phase"] for r in rows], [r["tokens_per_s"] for r in rows])
    gemm = next((r for r in summary["phases"] if r["phase"] == "gemm" and "limits" in r), None)
    for batch, limit in sorted((gemm or {}).get("limits", {}).items(), key=lambda kv: int(kv[0])):
        ax.axvline(limit["tokens_per_s"], linestyle="--", linewidth=1, color="gray")
        ax.annotate(f"fp32 GEMM limit, batch {batch}", (limit["tokens_per_s"], 0), rotation=90, fontsize=6)
    ax.set_xlabel("generated tokens / s (wall clock)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    _plot_drivers(plt, path.with_name("drivers.png"), summary)


def _plot_drivers(plt: Any, path: Path, summary: dict[str, Any]) -> None:
    """Tokens/s and slot utilization of each backend's two drivers on the EOS workload."""
    bars = [
        (f"{r['phase'].removeprefix('drivers_')} {driver}", d)
        for r in summary["phases"]
        if r["phase"] in ("drivers_engine", "drivers_vllm") and "drivers" in r
        for driver, d in r["drivers"].items()
    ]
    if not bars:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 1 + 0.35 * len(bars)), sharey=True)
    names = [name for name, _ in bars]
    left.barh(names, [d["tokens_per_s"] for _, d in bars])
    left.set_xlabel("useful tokens / s (wall clock)")
    right.barh(names, [100 * (d["slot_utilization"] or 0) for _, d in bars])
    right.axvline(90, linestyle="--", linewidth=1, color="gray")
    right.set_xlabel("slot utilization (%)")
    fig.suptitle("EOS workload: barrier (batch) vs asynchronous (turns) driver", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
