"""Tables and plots of the rollout throughput suite (:mod:`benchmarks.throughput.rollout_bench`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.throughput.rollout_drivers import EOS_PHASES

__all__ = ["eos_table", "eos_targets", "plot", "summarize"]

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
    rows = []
    for name, r in results.items():
        row = {"phase": name, **r}
        if name in EOS_PHASES:
            rows.append(row)
            continue
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

    best_engine = _best(results, "engine")
    best_int8 = _best(results, "ct2_int8")
    f32_shares = [
        r["of_gemm_limit"] for r in rows if r["phase"].startswith("ct2_float32") and "of_gemm_limit" in r
    ]
    targets = {
        "engine_vs_naive": ratio(engine, naive, "tokens_per_s"),
        "engine_vs_naive_cpu": ratio(engine, naive, "tokens_per_cpu_s"),
        "engine_vs_naive_target": 10.0,
        "engine_vs_vllm": ratio(engine, vllm, "tokens_per_s"),
        "engine_vs_vllm_cpu": ratio(engine, vllm, "tokens_per_cpu_s"),
        "engine_vs_vllm_target": 1.0,
        "ct2_int8_vs_naive": ratio(best_int8, naive, "tokens_per_s"),
        "ct2_int8_vs_naive_target": 20.0,
        "ct2_int8_vs_engine": ratio(best_int8, best_engine, "tokens_per_s"),
        "ct2_int8_vs_engine_target": 3.0,
        "ct2_float32_of_gemm_limit": max(f32_shares) if f32_shares else None,
        "ct2_float32_of_gemm_limit_target": 0.5,
        **eos_targets(results),
    }
    fixed = [r for r in rows if r["phase"] not in EOS_PHASES]
    table = (_table(cfg, fixed, targets) if fixed else "") + eos_table(cfg, results, targets)
    return {"config": cfg, "phases": rows, "targets": targets, "table": table}


def _best(results: dict[str, dict[str, Any]], base: str) -> dict[str, Any] | None:
    """The fastest row (tokens/s) among ``base`` and ``base_b<N>``."""
    found = [
        r for n, r in results.items() if (n == base or n.startswith(base + "_b")) and r.get("tokens_per_s")
    ]
    return max(found, key=lambda r: r["tokens_per_s"], default=None)


def _limit_at(limits: dict[str, Any], batch: Any) -> float | None:
    if not limits or not isinstance(batch, int):
        return None
    nearest = min(limits, key=lambda b: abs(int(b) - batch))
    return limits[nearest]["tokens_per_s"]


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "" if value is None else format(value, spec)


def _pct(value: Any) -> str:
    return "" if value is None else f"{100 * value:.0f}%"


def _table(c: dict[str, Any], rows: list[dict[str, Any]], targets: dict[str, Any]) -> str:
    lines = [
        f"Rollout throughput: {c['model']} on {c['task']} ({c['split']}), {c['episodes']} episodes "
        f"({c['samples']} samples per instance), concurrency {c['concurrency']} (or the phase's _b<N>), "
        f"max {c['max_turns']} turns, {c['max_new_tokens']} new tokens per turn (fixed), "
        f"T={c['temperature']}, {c['threads']} threads.",
        "",
        "| phase | backend | batch | episodes | turns | tokens/s | tokens/CPU-s | episodes/s | x naive tok/s "
        "| x naive tok/CPU-s | x naive ep/s | of GEMM limit | start-up s | peak RSS GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["phase"] in EOS_PHASES:
            continue
        if "skipped" in r:
            lines.append(f"| {r['phase']} | skipped: {r['skipped']} |" + "  |" * 12)
            continue
        if r["phase"] in ("roofline", "gemm"):
            continue
        lines.append(
            f"| {r['phase']} | {r.get('backend', '')} | {r.get('batch', '')} | {r.get('episodes', '')} "
            f"| {r.get('turns', '')} | {_fmt(r.get('tokens_per_s'))} | {_fmt(r.get('tokens_per_cpu_s'))} "
            f"| {_fmt(r.get('episodes_per_s'), '.3f')} | {_fmt(r.get('x_naive_wall'))} "
            f"| {_fmt(r.get('x_naive_cpu'))} | {_fmt(r.get('x_naive_episodes'))} "
            f"| {_pct(r.get('of_gemm_limit'))} | {_fmt(r.get('startup_s'))} "
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
        f"{_fmt(t['engine_vs_vllm_cpu'], '.2f')} on CPU time (target >= 1); CTranslate2 int8 (best "
        f"batch) / naive = {_fmt(t['ct2_int8_vs_naive'])} (target >= 20), / engine (best batch) = "
        f"{_fmt(t['ct2_int8_vs_engine'], '.2f')} (target >= 3); CTranslate2 float32 (best batch) = "
        f"{_pct(t['ct2_float32_of_gemm_limit'])} of the GEMM limit (target >= 50%).",
    ]
    return "\n".join(lines) + "\n"


# -- the EOS workload -----------------------------------------------------------------------------
_DRIVER_BACKENDS = (("drivers_engine", "engine"), ("drivers_vllm", "vllm"))


def eos_targets(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets on the EOS workload, from the phases measured (``None``: not measured)."""
    targets: dict[str, Any] = {}
    for phase, label in _DRIVER_BACKENDS:
        r = results.get(phase, {})
        turns = r.get("drivers", {}).get("turns", {})
        targets[f"{label}_turns_utilization"] = turns.get("slot_utilization")
        targets[f"{label}_turns_vs_batch"] = r.get("turns_vs_batch_tokens_per_s")
        targets[f"{label}_turns_vs_batch_cpu"] = r.get("turns_vs_batch_tokens_per_cpu_s")
    targets["turns_utilization_target"] = 0.9
    targets["turns_vs_batch_target"] = 1.5
    targets["dp_speedup"] = results.get("dp_engine", {}).get("speedup")
    targets["dp_speedup_target"] = 1.8
    return targets


def _driver_lines(r: dict[str, Any]) -> list[str]:
    lines = []
    for driver, d in r["drivers"].items():
        p10, p50, p90 = d["turn_tokens_p10_p50_p90"]
        new = driver == "turns"
        same = f"{r['episodes_equal']} of {r['episodes_compared']}" if new else ""
        lines.append(
            f"| {r['backend']} | {driver} | {r['batch']} | {d['episodes']} | {d['turns']} "
            f"| {p10:.0f} / {p50:.0f} / {p90:.0f} ({d['turn_tokens_max']}) | {d['generated_tokens']} "
            f"| {d['decode_steps']} | {_pct(d['slot_utilization'])} | {_fmt(d['tokens_per_s'])} "
            f"| {_fmt(d.get('tokens_per_cpu_s'))} "
            f"| {_fmt(r['turns_vs_batch_tokens_per_s'], '.2f') if new else ''} "
            f"| {_fmt(r.get('turns_vs_batch_tokens_per_cpu_s'), '.2f') if new else ''} "
            f"| {_fmt(r['turns_vs_batch_utilization'], '.2f') if new else ''} "
            f"| {same} "
            f"| {_fmt(d['load_1min'])} |"
        )
    return lines


def eos_table(c: dict[str, Any], results: dict[str, dict[str, Any]], t: dict[str, Any]) -> str:
    """The EOS workload's tables (drivers side by side, data-parallel layouts) and its targets."""
    drivers = [(p, results[p]) for p, _ in _DRIVER_BACKENDS if p in results]
    dp = results.get("dp_engine")
    if not drivers and not dp:
        return ""
    stops = "end of sequence or a speaker's tag" if c.get("eos_speaker_stops") else "end of sequence"
    lines = [
        "",
        f"EOS workload: {c['eos_episodes']} episodes ({c['samples']} samples per instance) of "
        f"{c['task']} ({c['split']}), max {c['max_turns']} turns, replies stop at {stops}, at most "
        f"{c['eos_max_new_tokens']} tokens, T={c['eos_temperature']} (seeded per request); "
        f"{c['eos_concurrency']} episodes in flight and {c['eos_concurrency']} batch slots on both "
        f"drivers, one engine per backend, {c['eos_threads']} torch thread(s) (vLLM: its own "
        "binding). batch = one blocking generate per turn of every running conversation (today's "
        "barrier driver); turns = each conversation's next turn submitted as its reply returns. "
        "Slot utilization = useful generated tokens (each reply's tokens up to the one that ended "
        "it) / (slots x decode steps), from the engine's counters. On a machine shared with other "
        "work the CPU-time ratio is the steadier (load: the 1-minute load average when the row "
        "ended). Turn tokens: p10 / p50 / p90 (max) of the turns' lengths with their speaker "
        "prefix. Same texts: episodes whose turns equal the batch driver's.",
        "",
    ]
    if drivers:
        lines += [
            "| backend | driver | slots | episodes | turns | turn tokens | useful tokens | decode steps "
            "| slot utilization | tokens/s | tokens/CPU-s | new/old tok/s | new/old tok/CPU-s "
            "| new/old utilization | same texts | load (1 min) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for phase, r in drivers:
            if "skipped" in r:
                lines.append(f"| {phase} | skipped: {r['skipped']} |" + "  |" * 14)
            else:
                lines += _driver_lines(r)
    if dp:
        lines += [
            "",
            f"Data-parallel generation ({dp['backend']}, {dp['batch']} slots per process, the "
            "trainer's job split): wall time from the first rank's start to the last rank's end, "
            "after every rank loaded its model.",
            "",
            "| processes | threads each | episodes | useful tokens | tokens per rank | seconds per rank "
            "| seconds | tokens/s | speedup | slot utilization | same texts | load (1 min) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for key, layout in dp["layouts"].items():
            many = key != "1"
            same = f"{dp['episodes_equal']} of {dp['episodes_compared']}" if many else ""
            lines.append(
                f"| {layout['processes']} | {layout['threads_each']} | {layout['episodes']} "
                f"| {layout['generated_tokens']} "
                f"| {' / '.join(str(n) for n in layout.get('rank_tokens', []))} "
                f"| {' / '.join(_fmt(x) for x in layout.get('rank_seconds', []))} "
                f"| {_fmt(layout['seconds'])} "
                f"| {_fmt(layout['tokens_per_s'])} | {_fmt(dp['speedup'], '.2f') if many else '1.00'} "
                f"| {_pct(layout['slot_utilization'])} "
                f"| {same} "
                f"| {_fmt(layout['load_1min'])} |"
            )
    lines += [line for _, r in drivers if (line := step_cost_line(r))]
    lines += ["", _eos_targets_line(t)]
    return "\n".join(lines) + "\n"


def step_cost(r: dict[str, Any]) -> dict[str, float] | None:
    """What a decode step costs beyond its rows' work, from the two drivers' rows of one engine.

    Both drivers generate the same tokens from the same prompts; they differ in decode steps. With
    CPU time = ``fixed`` x decode steps + (work per token and prefill, equal on both), ``fixed``
    = (CPU s old - CPU s new) / (steps old - steps new). ``None`` without CPU times, when the rows'
    tokens differ (then the work per token is not the same on both), or when the fixed part comes
    out outside (0, all of the new driver's time)."""
    old, new = r.get("drivers", {}).get("batch"), r.get("drivers", {}).get("turns")
    if not old or not new or old["generated_tokens"] != new["generated_tokens"]:
        return None
    if not old.get("cpu_seconds") or not new.get("cpu_seconds") or old["decode_steps"] == new["decode_steps"]:
        return None
    fixed = (old["cpu_seconds"] - new["cpu_seconds"]) / (old["decode_steps"] - new["decode_steps"])
    if not 0 < fixed * new["decode_steps"] < new["cpu_seconds"]:
        return None  # the rows do not fit the model (e.g. a load change between them)
    return {
        "fixed_s": fixed,
        "fixed_share_new": fixed * new["decode_steps"] / new["cpu_seconds"],
        "steps_old_over_new": old["decode_steps"] / new["decode_steps"],
    }


def step_cost_line(r: dict[str, Any]) -> str:
    """The sentence that reads :func:`step_cost` for one engine ("" when it cannot be computed)."""
    cost = step_cost(r)
    if cost is None:
        return ""
    return (
        f"\n{r['backend']}: a decode step costs {cost['fixed_s'] * 1000:.1f} ms of CPU time beyond its "
        f"live rows' work (from the two rows: the same tokens in {r['drivers']['batch']['decode_steps']} "
        f"and {r['drivers']['turns']['decode_steps']} steps), {_pct(cost['fixed_share_new'])} of the "
        "turns driver's CPU time; the rest is work per generated token and prefill, the same under "
        "both drivers, so tokens/s moves less than slot utilization here (the batch driver's finished "
        "rows leave its batch: its idle slots cost time only through the step's fixed part). Where a "
        "step costs the same for any number of live rows up to the slots (decode on a GPU is bound by "
        "reading the weights), tokens/s follows the decode steps: old / new decode steps "
        f"{cost['steps_old_over_new']:.2f}."
    )


def _met(value: Any, target: float) -> str:
    if value is None:
        return "not measured"
    return "met" if value >= target else "not met"


def _eos_targets_line(t: dict[str, Any]) -> str:
    parts = []
    for label, name in (("engine", "transformers"), ("vllm", "vLLM-CPU")):
        u, x, cpu = (
            t[f"{label}_turns_utilization"],
            t[f"{label}_turns_vs_batch"],
            t[f"{label}_turns_vs_batch_cpu"],
        )
        if u is None and x is None:
            parts.append(f"{name}: not measured")
            continue
        parts.append(
            f"{name}: turns driver slot utilization {_pct(u)} (target >= 90%: "
            f"{_met(u, t['turns_utilization_target'])}), tokens/s turns / batch "
            f"{_fmt(x, '.2f')} on wall-clock time, {_fmt(cpu, '.2f')} on CPU time (target >= 1.5: "
            f"{_met(x, t['turns_vs_batch_target'])} on wall-clock time, "
            f"{_met(cpu, t['turns_vs_batch_target'])} on CPU time)"
        )
    if t["dp_speedup"] is None:
        parts.append("data-parallel: not measured")
    else:
        parts.append(
            f"data-parallel {_fmt(t['dp_speedup'], '.2f')}x one process (target >= 1.8: "
            f"{_met(t['dp_speedup'], t['dp_speedup_target'])})"
        )
    return "Targets on the EOS workload: " + "; ".join(parts) + "."


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
