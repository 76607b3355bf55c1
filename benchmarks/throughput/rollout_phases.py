"""The phases of the rollout throughput suite (:mod:`benchmarks.throughput.rollout_bench`), one per
subprocess.

The fixed-length phases are here; the EOS workload's (``drivers_engine``, ``drivers_vllm``,
``dp_engine``) in :mod:`benchmarks.throughput.rollout_drivers`. Each phase takes the suite's
settings (a :class:`~benchmarks.throughput.rollout_bench.SuiteConfig`) and returns one JSON-ready
row. ``<backend>_b<N>`` phases play the same jobs with ``N`` episodes in
flight (and a policy batch of ``N``); the others use the suite's ``concurrency``.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from benchmarks.throughput.rollout_drivers import VLLM_MISSING, cpu_seconds, suite_vllm

__all__ = ["OLD_ENGINE", "PHASES", "linear_shapes", "new_engine", "phase_batch", "run_phase"]

PHASES = (
    "gemm",
    "roofline",
    "floor",
    "naive",
    "engine_old",
    "engine",
    "engine_b64",
    "vllm",
    "drivers_engine",
    "drivers_vllm",
    "dp_engine",
    "eos_engines",
    "fidelity",
)
"""Every phase, in the order the suite runs them (``floor``: :mod:`benchmarks.throughput.rollout_floor`;
``drivers_*``, ``dp_engine``: the EOS workload,
:mod:`benchmarks.throughput.rollout_drivers`; ``engine_old``, ``eos_engines``, ``fidelity``: the
engine comparison, :mod:`benchmarks.throughput.rollout_engines`)."""

OLD_ENGINE = {"precision": "float32", "sampler": "multinomial"}
"""The transformers engine before inverse-CDF sampling and mixed precision (``engine_old``, ``naive``)."""


def new_engine(cfg: Any) -> dict[str, str]:
    """The engine the suite measures (``engine``, ``engine_b64``): its ``precision``, the ``cdf`` sampler."""
    return {"precision": cfg.precision, "sampler": "cdf"}


_BATCHED = re.compile(r"^(?P<base>[a-z0-9_]+?)_b(?P<batch>\d+)$")


def phase_batch(name: str, cfg: Any) -> tuple[str, int]:
    """``(base phase, episodes in flight)`` of a phase name.

    >>> from types import SimpleNamespace
    >>> cfg = SimpleNamespace(concurrency=32)
    >>> phase_batch("engine_b64", cfg), phase_batch("engine", cfg)
    (('engine', 64), ('engine', 32))
    """
    match = _BATCHED.match(name)
    return (match["base"], int(match["batch"])) if match else (name, cfg.concurrency)


def run_phase(name: str, cfg: Any) -> dict[str, Any]:
    """Run one phase in this process and return its row (the engine comparison's ``eos_engines``
    and ``fidelity``: :func:`benchmarks.throughput.rollout_engines.run_engine_phase`)."""
    if name in ("drivers_engine", "drivers_vllm", "dp_engine"):
        from benchmarks.throughput.rollout_drivers import run_eos_phase

        return run_eos_phase(name, cfg)
    if name == "floor":
        from benchmarks.throughput.rollout_floor import run_floor_phase

        return run_floor_phase(cfg)
    base, batch = phase_batch(name, cfg)
    if base in ("naive", "engine", "engine_old"):
        return _phase_hf(cfg, naive=base == "naive", batch=batch, old=base == "engine_old")
    if base == "vllm":
        return _phase_vllm(cfg, batch)
    if base == "gemm":
        return _phase_gemm(cfg)
    return _phase_roofline(cfg)


# -- playing the jobs -----------------------------------------------------------------------------
def _jobs(cfg: Any):
    from optima_env.rollout import make_jobs

    return make_jobs(range(max(1, cfg.episodes // cfg.samples)), cfg.samples, cfg.seed)


def _sampling(cfg: Any):
    from optima_env.policy import SamplingParams

    return SamplingParams(
        temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, ignore_eos=True
    )


def _play(cfg: Any, policy: Any, tokenizer: Any, *, naive: bool, concurrency: int) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from optima_env import ConversationEnv, make_task
    from optima_env.rollout import rollout, run_episode

    task = make_task(cfg.task)
    env_kwargs = {"split": cfg.split, "max_turns": cfg.max_turns, "tokenizer": tokenizer}
    jobs = _jobs(cfg)
    started, cpu = time.perf_counter(), cpu_seconds()
    if naive:
        episodes = [
            run_episode(
                ConversationEnv(task, **env_kwargs),
                policy,
                seed=job.seed,
                sampling=_sampling(cfg),
                options={"index": job.index},
            )
            for job in tqdm(jobs[: cfg.naive_episodes], desc="naive loop", unit="ep")
        ]
    else:
        episodes = rollout(
            task,
            policy,
            jobs=jobs,
            sampling=_sampling(cfg),
            concurrency=concurrency,
            env_kwargs=env_kwargs,
            progress=True,
        )
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    turns = sum(len(e.turns) for e in episodes)
    return {
        "batch": 1 if naive else min(concurrency, len(jobs)),  # episodes in flight at most
        "episodes": len(episodes),
        "turns": turns,
        "generated_tokens": turns * cfg.max_new_tokens,
        "env_tokens": sum(e.num_tokens for e in episodes),
        "seconds": seconds,
        "cpu_seconds": cpu,
        "tokens_per_s": turns * cfg.max_new_tokens / seconds,
        "tokens_per_cpu_s": turns * cfg.max_new_tokens / cpu,
        "episodes_per_s": len(episodes) / seconds,
        "mean_score": sum(e.task_score for e in episodes) / len(episodes),
    }


# -- the backends ---------------------------------------------------------------------------------
def _phase_hf(cfg: Any, *, naive: bool, batch: int, old: bool = False) -> dict[str, Any]:
    import torch

    from optima_env.backends.hf import TransformersPolicy

    torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    policy = TransformersPolicy.from_pretrained(
        cfg.model,
        dtype="float32",
        batch_size=1 if naive else batch,
        fast=not naive,
        **(OLD_ENGINE if old or naive else new_engine(cfg)),
    )
    load = time.perf_counter() - started
    result = _play(cfg, policy, policy.tokenizer, naive=naive, concurrency=batch)
    stats = policy.stats
    return {
        **result,
        "startup_s": load,
        "backend": "transformers generate, batch 1" if naive else "transformers fast path",
        "engine": policy.engine,
        "prefill_share": stats.prefilled_tokens / max(1, stats.prompt_tokens),
        "threads": cfg.threads,
        "stats": dataclasses.asdict(stats),
    }


def _phase_vllm(cfg: Any, batch: int) -> dict[str, Any]:
    started = time.perf_counter()
    policy = suite_vllm(cfg)
    if policy is None:
        return dict(VLLM_MISSING)
    load = time.perf_counter() - started
    try:
        result = _play(cfg, policy, policy.tokenizer, naive=False, concurrency=batch)
    finally:
        policy.close()
    return {**result, "startup_s": load, "backend": "vLLM offline engine (prefix caching)"}


# -- limits ---------------------------------------------------------------------------------------
def linear_shapes(config: Any) -> list[tuple[int, int, int]]:
    """``(in, out, count)`` of every matrix product a decode step of a Llama-like model runs per token.

    >>> from types import SimpleNamespace
    >>> c = SimpleNamespace(hidden_size=8, intermediate_size=16, num_attention_heads=2,
    ...                     num_key_value_heads=1, num_hidden_layers=3, vocab_size=100)
    >>> linear_shapes(c)
    [(8, 8, 6), (8, 4, 6), (8, 16, 6), (16, 8, 3), (8, 100, 1)]
    """
    hidden, layers = config.hidden_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q = config.num_attention_heads * head_dim
    kv = config.num_key_value_heads * head_dim
    inter = config.intermediate_size
    shapes = [(hidden, q, layers), (q, hidden, layers), (hidden, kv, 2 * layers)]
    shapes += [(hidden, inter, 2 * layers), (inter, hidden, layers), (hidden, config.vocab_size, 1)]
    merged: dict[tuple[int, int], int] = {}
    for k, n, count in shapes:
        merged[(k, n)] = merged.get((k, n), 0) + count
    return [(k, n, count) for (k, n), count in merged.items()]


def _phase_gemm(cfg: Any) -> dict[str, Any]:
    """The fp32 GEMM-bound decode rate: torch matmuls on the model's shapes, best of 5 trials each."""
    import torch
    import transformers

    from optima_env.models import resolve_model_path

    torch.set_num_threads(cfg.threads)
    config = transformers.AutoConfig.from_pretrained(resolve_model_path(cfg.model))
    shapes = linear_shapes(config)
    params = sum(k * n * count for k, n, count in shapes)
    limits = {}
    with torch.inference_mode():
        for batch in sorted({32, 64, cfg.concurrency}):
            step = 0.0
            for k, n, count in shapes:
                x, w = torch.randn(batch, k), torch.randn(n, k)
                torch.nn.functional.linear(x, w)  # warm-up
                best = float("inf")
                for _ in range(5):
                    calls, started = 0, time.perf_counter()
                    while calls < 3 or time.perf_counter() - started < 0.02:
                        torch.nn.functional.linear(x, w)
                        calls += 1
                    best = min(best, (time.perf_counter() - started) / calls)
                step += best * count
            limits[str(batch)] = {
                "tokens_per_s": batch / step,
                "gflops": 2 * batch * params / step / 1e9,
            }
    return {
        "limits": limits,
        "params_per_token": params,
        "shapes": shapes,
        "backend": "fp32 torch matmuls on the model's shapes",
    }


def _phase_roofline(cfg: Any) -> dict[str, Any]:
    import torch

    from optima_env.backends.hf import decode_roofline
    from optima_env.models import load_model

    torch.set_num_threads(cfg.threads)
    model, _ = load_model(cfg.model, dtype="float32")
    steps = 8
    rates = {}
    for key, fast, clock in (
        ("tokens_per_s", True, time.perf_counter),
        ("tokens_per_s_transformers_default", False, time.perf_counter),
        ("tokens_per_cpu_s", True, time.process_time),
        ("tokens_per_cpu_s_transformers_default", False, time.process_time),
    ):
        rates[key] = decode_roofline(
            model, batch=cfg.concurrency, context=cfg.roofline_context, steps=steps, fast=fast, clock=clock
        )
    return {
        **rates,
        "batch": cfg.concurrency,
        "context": cfg.roofline_context,
        "steps": steps,
        "backend": "forward only",
    }
