"""``python -m benchmarks.throughput.gpu_check``: the prepared device check of a GPU run (issue 29).

On one GPU, with torch, transformers, PEFT, accelerate and TRL only (no vLLM), it builds a randomly
initialised model of Llama-3-8B's shape (hidden 4096, 32 layers, 32 heads / 8 KV heads, intermediate
14336, Llama 3's 128,256-token vocabulary: the LM head and the logits at their real size, though the
embedded SmolLM2 tokenizer's 49,152 tokens are the only ids used) in bf16 (``build_model``:
initialised on the GPU, saved) and runs, phase by phase, the project's own code on it, in the
loop's order:

* ``fork``: a child process forked after ``torch.cuda.is_available()`` (what the trainers call
  before a vLLM engine starts) touches CUDA, then a spawned one does: what vLLM's engine core
  meets without and with ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` (a few seconds);
* ``readability``: :class:`optima_env.readability.TransformersLMLoss` with the built model (the
  loop's frozen base model) on 64 turns of up to 2,000 tokens (the paper profile's longest turn);
  where an engine would start or wake with the scorer loaded, and after it left;
* ``tree``: a tree stage's peak, the scorer scoring beside an awake engine, emulated (vLLM itself is
  not in the image) by holding ``u x total`` in one allocation while the scorer loads and scores:
  at the default ``u`` = 0.9 and at the value the memory plan fits
  (:mod:`optima_trainers.run.memory_plan`); each records whether it fit;
* ``sft_stage_1`` and ``sft_stage_2``: two LoRA SFT stages of :func:`optima_trainers.sft.trainer.train_sft`
  (the ``paper`` profile's ``sft`` section: 2,048-token examples, LoRA, gradient checkpointing as
  the config resolves it on the device, bf16), the second starting from the first's checkpoint;
* ``dpo_step``: one step of :func:`optima_trainers.dpo.trainer.train_dpo` on one pair of
  2 x 4,096 tokens (the paper profile's ``dpo.max_length``).

After each stage it records where an engine would start: the free memory (``mem_get_info``) as the
trainer left it, then after ``gc.collect()`` and ``torch.cuda.empty_cache()`` (what vLLM V1's worker
does before it compares the free memory with ``gpu_memory_utilization x total`` and refuses to
start below it: ``vllm/v1/worker/gpu_worker.py``, ``init_device``), against the configured
``generation.vllm_gpu_memory_utilization``. Every phase records its seconds, peak memory
(``max_memory_allocated``, reset per phase), what it left allocated and the process's resident
memory; an error (an OOM, a refusal) is recorded and the next phase runs. ``<out>/gpu_check.json``
is rewritten atomically at each phase's start and end (a killed run keeps its finished phases);
no phase starts past ``--budget-s``; ``--skip`` leaves one out. ``--dry-run``: the same phases on
the CPU with a tiny shape (2 layers, 64 wide, the tokenizer's vocabulary) in well under a minute (CI
runs it; ``tree`` then has no device memory to hold and records so).

The device image has no TRL, datasets, PettingZoo or Gymnasium (``optima_env`` imports the last
two) and no network: ``--prepare`` writes the embedded tokenizer and those wheels (this
environment's versions) into ``.gpu_check/`` (ignored by git), which the device tool carries
(README "Scaling out", "The device check"). Checkpoints go to ``--work-dir`` (default: a temporary
folder, removed at the end), each deleted once the next phase has loaded it: at most two model
folders at a time (2 B x 7.38e9 parameters = 14.8 GB each at the 8B shape).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.throughput.gpu_check_phases import PHASES, PLANS, SHAPES, Check, Recorder
from optima_env.errors import require

__all__ = ["CARRY", "main", "prepare", "run_check"]

CARRY = Path(".gpu_check")  # the carried folder (repository root): tokenizer/ and wheels/
WHEELS = ("trl", "datasets", "dill", "multiprocess", "gymnasium", "pettingzoo", "farama-notifications")
"""Pure-Python packages the device image lacks (TRL's runtime needs, and optima_env's envs)."""


def run_check(
    out: Path, *, shape: str, tokenizer: Path, work_dir: Path | None, budget_s: float, skip: tuple = ()
) -> dict:
    """Run :data:`PHASES` (but ``skip``) at ``shape``; returns the document written to ``out``."""
    torch = require("torch", "train")
    out.mkdir(parents=True, exist_ok=True)
    rec = Recorder(out, torch, budget_s, skip)
    rec.doc["meta"] = {"shape": shape, "plan": dataclasses.asdict(PLANS[shape]), "budget_s": budget_s,
                       "command": " ".join(sys.argv),
                       "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    owned = work_dir is None
    work = Path(tempfile.mkdtemp(prefix="gpu-check-")) if owned else work_dir
    work.mkdir(parents=True, exist_ok=True)
    try:
        check = Check(rec, PLANS[shape], tokenizer, work)
        bodies = {"environment": check.environment, "build_model": check.build_model,
                  "sft_stage_1": check.sft_stage(1), "sft_stage_2": check.sft_stage(2),
                  "dpo_step": check.dpo_step, "readability": check.readability,
                  "fork": check.fork, "tree": check.tree}  # fmt: skip
        for name in PHASES:
            rec.run(name, bodies[name])
    except Exception as exc:  # the setup itself failed (no phase can run): recorded, then raised
        rec.doc["meta"]["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        rec.doc["meta"]["seconds"] = time.perf_counter() - rec.start
        rec.write()
        if owned:
            shutil.rmtree(work, ignore_errors=True)
    return rec.doc


def prepare(folder: Path = CARRY) -> list[str]:
    """Write what the device needs into ``folder``: the embedded tokenizer and the wheels of
    :data:`WHEELS` at this environment's versions (``pip download``, Python 3.12, no dependencies)."""
    from optima_env.models import ensure_embedded_model

    transformers = require("transformers", "train")
    transformers.AutoTokenizer.from_pretrained(ensure_embedded_model()).save_pretrained(folder / "tokenizer")
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", "-d", str(folder / "wheels"), *pins],
        check=True,
    )  # fmt: skip
    return pins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput.gpu_check", description="GPU device check"
    )
    parser.add_argument("--out", type=Path, help="folder of gpu_check.json")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--dry-run", action="store_true", help="--shape tiny on the CPU (CI)")
    parser.add_argument("--tokenizer", type=Path, help=f"tokenizer folder (default {CARRY}/tokenizer, "
                        "else the embedded model's)")  # fmt: skip
    parser.add_argument("--work-dir", type=Path, help="where checkpoints go (default: a temporary folder)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no phase after this (seconds)")
    parser.add_argument("--skip", action="append", choices=PHASES[1:], default=[], help="a phase not to run")
    parser.add_argument("--prepare", action="store_true", help=f"write the tokenizer and wheels to {CARRY}/")
    args = parser.parse_args(argv)
    try:
        if args.prepare:
            print("prepared", CARRY, *prepare())
            return 0
        if args.out is None:
            raise ValueError("--out FOLDER is required (where gpu_check.json is written)")
        torch = require("torch", "train")
        shape = "tiny" if args.dry_run else args.shape
        if args.dry_run:
            torch.set_num_threads(1)
        elif shape != "tiny" and not torch.cuda.is_available():
            raise ValueError(f"--shape {shape} needs a CUDA GPU, and torch sees none; on a CPU use --dry-run")
        tokenizer = args.tokenizer or (CARRY / "tokenizer" if (CARRY / "tokenizer").is_dir() else None)
        if tokenizer is None:
            from optima_env.models import ensure_embedded_model

            tokenizer = ensure_embedded_model()
        if not (Path(tokenizer) / "tokenizer_config.json").is_file():
            raise FileNotFoundError(f"no tokenizer in {tokenizer}; run --prepare, or pass --tokenizer FOLDER")
        doc = run_check(args.out, shape=shape, tokenizer=Path(tokenizer), work_dir=args.work_dir,
                        budget_s=args.budget_s, skip=tuple(args.skip))  # fmt: skip
    except (ValueError, FileNotFoundError, subprocess.CalledProcessError) as exc:  # the user's: one line
        print(f"gpu_check: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for name, record in doc["phases"].items():
        seconds = record.get("seconds", 0.0)
        print(f"{name:12s} {record['status']:8s} {seconds:8.1f} s  {record.get('error', '')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
