"""The rollout suite's engine comparison (:mod:`benchmarks.throughput.rollout_bench`): the transformers
engine against the one before inverse-CDF sampling and mixed precision, side by side in one run,
and the fidelity of the CPU decode precision.

Phases:

* ``engine_old``: the fixed-length workload on the engine as it was: fp32 linear layers and per-row
  ``torch.multinomial`` (:data:`OLD_ENGINE`); ``engine`` plays the suite's ``precision`` with the
  ``cdf`` sampler, so the two rows read as new against old.
* ``eos_engines``: the EOS workload (:mod:`benchmarks.throughput.rollout_drivers`) on the turns
  driver, the old engine then the new one, each a fresh policy with ``eos_concurrency`` slots and
  ``eos_threads`` torch threads.
* ``fidelity``: the engine's bf16 linear layers against fp32, teacher-forced on task text
  (:func:`optima_env.backends.precision.fidelity`): the conversations of the suite's first
  ``fidelity_episodes`` jobs, played by the fp32 engine at the suite's temperature, each
  episode's last prompt with its reply (which holds every earlier turn); the next-token
  distributions at the suite's temperature. Targets: mean total variation distance at most
  0.01, the same most likely token at least 98% of the time. Then the batch dependence of each
  precision: those episodes' last prompts sampled (the suite's sampling, the ``cdf`` sampler) in
  one batch and one at a time, the replies compared text for text.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from benchmarks.throughput.rollout_phases import OLD_ENGINE, _jobs, _sampling, new_engine

__all__ = ["ENGINE_PHASES", "OLD_ENGINE", "engines_text", "new_engine", "run_engine_phase"]

ENGINE_PHASES = ("eos_engines", "fidelity")
"""The phases this module runs, in the order the suite runs them (``engine_old`` is a fixed-length
phase of :mod:`benchmarks.throughput.rollout_phases`)."""

FIDELITY_TARGETS = {"tv_mean": 0.01, "top_token_agreement": 0.98}
"""Most mean total variation distance, least top-token agreement."""


def run_engine_phase(name: str, cfg: Any) -> dict[str, Any]:
    """Run one phase of this module in this process and return its row."""
    if name == "eos_engines":
        return _eos_engines(cfg)
    if name == "fidelity":
        return _fidelity(cfg)
    raise ValueError(f"unknown engine phase {name!r}; choose among {list(ENGINE_PHASES)}")


def _eos_engines(cfg: Any) -> dict[str, Any]:
    import torch

    from benchmarks.throughput.rollout_drivers import _play, _row, _warm_up, eos_jobs, texts
    from optima_env.backends.hf import DecodeStats, TransformersPolicy

    torch.set_num_threads(cfg.eos_threads)
    jobs = eos_jobs(cfg)
    rows, outputs = {}, {}
    for label, engine in (("old", OLD_ENGINE), ("new", new_engine(cfg))):
        policy = TransformersPolicy.from_pretrained(
            cfg.model, dtype="float32", batch_size=cfg.eos_concurrency, fast=True, **engine
        )
        _warm_up(policy)
        policy.clear_cache()
        policy.stats = DecodeStats()
        episodes, seconds, cpu = _play(cfg, policy, policy.tokenizer, jobs, "turns")
        stats = policy.stats
        rows[label] = {
            **_row(episodes, seconds, cpu, stats.generated_tokens, stats.decode_steps, cfg.eos_concurrency),
            "engine": policy.engine,
            "threads": cfg.eos_threads,
            "stats": dataclasses.asdict(stats),
        }
        outputs[label] = texts(episodes)
        del policy
    old, new = rows["old"], rows["new"]
    return {
        "backend": "transformers fast path, turns driver",
        "batch": cfg.eos_concurrency,
        "engines": rows,
        "new_vs_old_tokens_per_s": new["tokens_per_s"] / old["tokens_per_s"],
        "new_vs_old_tokens_per_cpu_s": new["tokens_per_cpu_s"] / old["tokens_per_cpu_s"],
        "episodes_equal": sum(a == b for a, b in zip(outputs["old"], outputs["new"])),
        "episodes_compared": len(outputs["old"]),
    }


def _fidelity(cfg: Any) -> dict[str, Any]:
    import torch

    from optima_env import make_task
    from optima_env.backends.hf import TransformersPolicy, render_prompt
    from optima_env.backends.precision import cpu_has_native_bf16, fidelity, resolve_precision
    from optima_env.rollout import rollout

    torch.set_num_threads(cfg.threads)
    policy = TransformersPolicy.from_pretrained(
        cfg.model, dtype="float32", batch_size=cfg.concurrency, fast=True, **OLD_ENGINE
    )
    tokenizer = policy.tokenizer
    last: dict[Any, tuple[Any, str]] = {}
    generate = policy.generate

    def recording(requests: Any, sampling: Any) -> list[str]:
        replies = generate(requests, sampling)
        for request, reply in zip(requests, replies):
            last[request.key[:-1] if isinstance(request.key, tuple) else request.key] = (request, reply)
        return replies

    policy.generate = recording  # the batch driver calls generate once per turn
    jobs = _jobs(cfg)[: cfg.fidelity_episodes]
    env_kwargs = {"split": cfg.split, "max_turns": cfg.max_turns, "tokenizer": tokenizer}
    rollout(make_task(cfg.task), policy, jobs=jobs, sampling=_sampling(cfg), concurrency=len(jobs),
            env_kwargs=env_kwargs, driver="batch", progress=False)  # fmt: skip
    sequences = [
        tokenizer(render_prompt(tokenizer, request) + reply[len(request.prefix) :], add_special_tokens=False)[
            "input_ids"
        ]
        for request, reply in last.values()
    ]
    started = time.perf_counter()
    measured = fidelity(policy.model, sequences, temperature=cfg.temperature)
    requests = [request for request, _ in last.values()]
    alone = {}
    for precision in sorted({"float32", resolve_precision(cfg.precision)}):
        engine = TransformersPolicy(
            policy.model, tokenizer, batch_size=len(requests), prefix_cache_mb=0, precision=precision
        )
        alone[precision] = _same_alone(engine, requests, _sampling(cfg))
    return {
        **measured,
        "same_alone": alone,
        "sequences": len(sequences),
        "seconds": time.perf_counter() - started,
        "native_bf16": cpu_has_native_bf16(),
        "auto_resolves_to": resolve_precision("auto"),
        "targets": FIDELITY_TARGETS,
        "met": measured["tv_mean"] <= FIDELITY_TARGETS["tv_mean"]
        and measured["top_token_agreement"] >= FIDELITY_TARGETS["top_token_agreement"],
        "backend": "teacher-forced: the engine's bf16 against fp32",
    }


def _same_alone(policy: Any, requests: list[Any], sampling: Any) -> int:
    """How many of ``requests`` get the same reply from ``policy`` in one batch and alone (seeded
    per request, so a batch-independent engine answers all of them alike)."""
    together = policy.generate(requests, sampling)
    return sum(policy.generate([request], sampling)[0] == reply for request, reply in zip(requests, together))


def _of_floor(new: dict[str, Any], old: dict[str, Any]) -> str:
    """``"; of their floors: new x%, old y%"`` when the rows carry their floors (else empty)."""
    if new.get("of_floor") is None or old.get("of_floor") is None:
        return ""
    return (
        f"; of their floors: new {new['of_floor']:.0%} ({new['floor']['floor_tokens_per_s']:.1f} tok/s), "
        f"old {old['of_floor']:.0%} ({old['floor']['floor_tokens_per_s']:.1f} tok/s)"
    )


_VARIANTS = {
    "engine": "the engine's bfloat16: bf16 linear layers and LM head (top 64 logits recomputed in "
    "fp32), fp32 KV cache",
    "linears": "bf16 linear layers but the LM head, fp32 KV cache (mixed version 1)",
    "plain_lm_head": "bf16 linear layers and a plain bf16 LM head (measured, not used)",
    "bf16_kv": "the engine's with a bf16 KV cache (mixed version 2; measured, not used)",
}


def engines_text(results: dict[str, dict[str, Any]]) -> str:
    """The report's paragraphs on the engine comparison and the fidelity (empty without them)."""
    parts = []
    old, new = results.get("engine_old", {}), results.get("engine", {})
    if old.get("tokens_per_s") and new.get("tokens_per_s"):
        parts.append(
            f"Engine, new against old (fixed-length workload, batch {new.get('batch')}, same run): "
            f"{new['tokens_per_s']:.1f} against {old['tokens_per_s']:.1f} tok/s = "
            f"{new['tokens_per_s'] / old['tokens_per_s']:.2f}x on wall-clock time, "
            f"{new['tokens_per_cpu_s'] / old['tokens_per_cpu_s']:.2f}x on CPU time (new: "
            f"{new.get('engine')}; old: {old.get('engine')}){_of_floor(new, old)}. Targets: at least 2x "
            "and 150 tok/s."
        )
    eos = results.get("eos_engines", {})
    if eos.get("engines"):
        o, n = eos["engines"]["old"], eos["engines"]["new"]
        parts.append(
            f"EOS workload, turns driver, new engine against old (batch {eos['batch']}): "
            f"{n['tokens_per_s']:.1f} against {o['tokens_per_s']:.1f} tok/s = "
            f"{eos['new_vs_old_tokens_per_s']:.2f}x on wall-clock time, "
            f"{eos['new_vs_old_tokens_per_cpu_s']:.2f}x on CPU time; same texts: "
            f"{eos['episodes_equal']} of {eos['episodes_compared']} (another sampler's random stream "
            f"and precision give other texts){_of_floor(n, o)}. Target: at least 1.4x."
        )
    fid = results.get("fidelity", {})
    if "tv_mean" in fid:
        parts.append(
            f"Fidelity of the engine's bf16 decode against fp32 (teacher-forced on {fid['sequences']} "
            f"conversations of the task, {fid['positions']} positions, T={fid['temperature']}): total "
            f"variation distance {fid['tv_mean']:.4f} mean, {fid['tv_p99']:.4f} at the 99th percentile; "
            f"same most likely token {fid['top_token_agreement']:.1%} (targets: at most "
            f"{FIDELITY_TARGETS['tv_mean']}, at least {FIDELITY_TARGETS['top_token_agreement']:.0%}: "
            f"{'met' if fid['met'] else 'not met'}). This CPU has native bf16: "
            f"{'yes' if fid['native_bf16'] else 'no'}; precision auto decodes in {fid['auto_resolves_to']}."
        )
        if fid.get("same_alone"):
            parts[-1] += " Same reply for a seeded prompt in one batch and alone: " + ", ".join(
                f"{precision} {same} of {fid['sequences']}" for precision, same in fid["same_alone"].items()
            ) + "."
        for name, v in fid.get("variants", {}).items():
            parts[-1] += (
                f"\n- {_VARIANTS.get(name, name)}: TV {v['tv_mean']:.4f} mean, {v['tv_p99']:.4f} at the "
                f"99th percentile; same most likely token {v['top_token_agreement']:.1%}."
            )
    return "\n\n".join(parts) + ("\n" if parts else "")
