"""The EOS workload's tables (:mod:`benchmarks.throughput.rollout_drivers`: the two rollout drivers
side by side, data-parallel layouts), its targets, and what the rows say about where time went;
also the number formats of every table of the rollout suite (:func:`fmt`, :func:`pct`)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "dp_shares",
    "dp_shares_line",
    "eos_table",
    "eos_targets",
    "fmt",
    "pct",
    "rank_rates",
    "step_cost",
    "step_cost_line",
]


def fmt(value: Any, spec: str = ".1f") -> str:
    """``value`` formatted with ``spec`` ("" for ``None``: not measured)."""
    return "" if value is None else format(value, spec)


def pct(value: Any) -> str:
    """A share as a whole percentage ("" for ``None``)."""
    return "" if value is None else f"{100 * value:.0f}%"


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
            f"| {d['decode_steps']} | {pct(d['slot_utilization'])} | {fmt(d['tokens_per_s'])} "
            f"| {fmt(d.get('tokens_per_cpu_s'))} "
            f"| {fmt(r['turns_vs_batch_tokens_per_s'], '.2f') if new else ''} "
            f"| {fmt(r.get('turns_vs_batch_tokens_per_cpu_s'), '.2f') if new else ''} "
            f"| {fmt(r['turns_vs_batch_utilization'], '.2f') if new else ''} "
            f"| {same} "
            f"| {fmt(d['load_1min'])} |"
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
        lines += _dp_lines(dp)
    for _, r in drivers:
        if line := step_cost_line(r):
            lines += ["", line]
    lines += ["", _eos_targets_line(t)]
    return "\n".join(lines) + "\n"


def _dp_lines(dp: dict[str, Any]) -> list[str]:
    """The data-parallel table and what its rows say about the speedup."""
    lines: list[str] = []
    lines += [
        "",
        f"Data-parallel generation ({dp['backend']}, {dp['batch']} slots per process, the "
        "trainer's job split): wall time from the first rank's start to the last rank's end, "
        "after every rank loaded its model.",
        "",
        "| processes | threads each | episodes | useful tokens | tokens per rank | seconds per rank "
        "| tokens/s per rank | seconds | tokens/s | speedup | slot utilization | same texts "
        "| load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, layout in dp["layouts"].items():
        many = key != "1"
        same = f"{dp['episodes_equal']} of {dp['episodes_compared']}" if many else ""
        lines.append(
            f"| {layout['processes']} | {layout['threads_each']} | {layout['episodes']} "
            f"| {layout['generated_tokens']} "
            f"| {' / '.join(str(n) for n in layout.get('rank_tokens', []))} "
            f"| {' / '.join(fmt(x) for x in layout.get('rank_seconds', []))} "
            f"| {' / '.join(fmt(x) for x in rank_rates(layout))} "
            f"| {fmt(layout['seconds'])} "
            f"| {fmt(layout['tokens_per_s'])} | {fmt(dp['speedup'], '.2f') if many else '1.00'} "
            f"| {pct(layout['slot_utilization'])} "
            f"| {same} "
            f"| {fmt(layout['load_1min'])} |"
        )
    if line := dp_shares_line(dp):
        lines += ["", line]
    return lines


def rank_rates(layout: dict[str, Any]) -> list[float]:
    """Each rank's tokens/s over its own playing time."""
    return [t / s for t, s in zip(layout.get("rank_tokens", []), layout.get("rank_seconds", [])) if s > 0]


def dp_shares(dp: dict[str, Any]) -> dict[str, float] | None:
    """Where the data-parallel speedup went: ``equal_shares`` = the ranks' rates summed over one
    process's rate (the speedup had every rank finished together), ``rank_over_one`` = the mean
    rank's rate over one process's (below 1: the processes slow each other, e.g. sharing memory
    bandwidth); ``None`` without per-rank figures."""
    many = [v for k, v in dp.get("layouts", {}).items() if k != "1"]
    one = dp.get("layouts", {}).get("1")
    rates = rank_rates(many[0]) if many and one else []
    if not rates or not one.get("tokens_per_s"):
        return None
    return {
        "equal_shares": sum(rates) / one["tokens_per_s"],
        "rank_over_one": sum(rates) / len(rates) / one["tokens_per_s"],
    }


def dp_shares_line(dp: dict[str, Any]) -> str:
    """The sentence that reads :func:`dp_shares` ("" when it cannot be computed)."""
    shares = dp_shares(dp)
    if shares is None:
        return ""
    return (
        f"Where the speedup went: had every rank finished together, the ranks' rates summed give "
        f"{shares['equal_shares']:.2f}x one process (the rest of the gap to the measured "
        f"{dp['speedup']:.2f}x: the ranks' shares of the work differ, as their tokens show); each "
        f"rank ran at {pct(shares['rank_over_one'])} of one lone process's rate (the processes "
        "share the machine's memory bandwidth and caches; GPUs, one per rank, do not)."
    )


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
        f"{r['backend']}: a decode step costs {cost['fixed_s'] * 1000:.1f} ms of CPU time beyond its "
        f"live rows' work (from the two rows: the same tokens in {r['drivers']['batch']['decode_steps']} "
        f"and {r['drivers']['turns']['decode_steps']} steps), {pct(cost['fixed_share_new'])} of the "
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
            f"{name}: turns driver slot utilization {pct(u)} (target >= 90%: "
            f"{_met(u, t['turns_utilization_target'])}), tokens/s turns / batch "
            f"{fmt(x, '.2f')} on wall-clock time, {fmt(cpu, '.2f')} on CPU time (target >= 1.5: "
            f"{_met(x, t['turns_vs_batch_target'])} on wall-clock time, "
            f"{_met(cpu, t['turns_vs_batch_target'])} on CPU time)"
        )
    if t["dp_speedup"] is None:
        parts.append("data-parallel: not measured")
    else:
        parts.append(
            f"data-parallel {fmt(t['dp_speedup'], '.2f')}x one process (target >= 1.8: "
            f"{_met(t['dp_speedup'], t['dp_speedup_target'])})"
        )
    return "Targets on the EOS workload: " + "; ".join(parts) + "."
