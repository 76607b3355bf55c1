"""``python -m benchmarks.throughput.gpu_check``: the prepared device check of a GPU run (issue 29).

On one GPU, with torch, transformers, PEFT, accelerate and TRL only (no vLLM), it builds a randomly
initialised model of Llama-3-8B's shape (hidden 4096, 32 layers, 32 heads / 8 KV heads, intermediate
14336; the vocabulary of the embedded SmolLM2 tokenizer, 49,152 tokens against Llama 3's 128,256)
in bf16 (``build_model``: initialised on the GPU, saved) and runs, phase by phase, the project's own
code on it, in the loop's order:

* ``readability``: :class:`optima_env.readability.TransformersLMLoss` with the built model (the
  loop's frozen base model) on 64 turns of up to 2,000 tokens (the paper profile's longest turn);
* ``sft_stage_1`` and ``sft_stage_2``: two LoRA SFT stages of :func:`optima_trainers.sft.trainer.train_sft`
  (the ``paper`` profile's ``sft`` section: 2,048-token examples, LoRA, gradient checkpointing as
  the config resolves it on the device, bf16), the second starting from the first's checkpoint;
* ``dpo_step``: one step of :func:`optima_trainers.dpo.trainer.train_dpo` on one pair of 2 x 2,048 tokens.

After each stage it records where an engine would start: the free memory (``mem_get_info``) as the
trainer left it, then after ``gc.collect()`` and ``torch.cuda.empty_cache()`` (what vLLM V1's worker
does before it compares the free memory with ``gpu_memory_utilization x total`` and refuses to
start below it: ``vllm/v1/worker/gpu_worker.py``, ``init_device``), against the configured
``generation.vllm_gpu_memory_utilization``. Every phase records its seconds, peak memory
(``max_memory_allocated``, reset per phase), what it left allocated and the process's resident
memory; an error (an OOM, a refusal) is recorded and the next phase runs. ``<out>/gpu_check.json``
is rewritten atomically at each phase's start and end (a killed run keeps its finished phases);
no phase starts past ``--budget-s``; ``--skip`` leaves one out. ``--dry-run``: the same phases on
the CPU with a tiny shape (2 layers, 64 wide) in well under a minute (CI runs it).

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
import gc
import importlib.metadata
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optima_env.errors import require
from optima_env.io import write_json_atomic

__all__ = ["PHASES", "SHAPES", "Plan", "main", "prepare", "run_check"]

CARRY = Path(".gpu_check")  # the carried folder (repository root): tokenizer/ and wheels/
WHEELS = ("trl", "datasets", "dill", "multiprocess", "gymnasium", "pettingzoo", "farama-notifications")
"""Pure-Python packages the device image lacks (TRL's runtime needs, and optima_env's envs)."""
RESULT = "gpu_check.json"

SHAPES: dict[str, dict[str, int]] = {
    "llama3-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, intermediate_size=14336),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128),
}  # fmt: skip
"""Model shapes (``LlamaConfig`` fields); the vocabulary is the tokenizer's."""


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What each phase runs at a shape."""

    shape: str
    sft_tokens: int
    """Tokens of each SFT example (the paper profile's ``sft.max_length`` at the 8B shape)."""
    sft_steps: int = 2
    sft_batch: int = 2
    """``sft.batch_size`` (one example per forward pass, as the paper profile; accumulation 2)."""
    dpo_tokens: int = 2048
    """Prompt + completion tokens of each side of the DPO pair."""
    dpo_completion: int = 256
    turn_tokens: int = 2000
    """Tokens of each scored turn (the paper profile's ``generation.max_new_tokens``: the longest)."""
    turns: int = 64


PLANS = {
    "llama3-8b": Plan("llama3-8b", sft_tokens=2048),
    "tiny": Plan("tiny", sft_tokens=128, dpo_tokens=256, dpo_completion=32, turn_tokens=32),
}
_WORDS = "the river stone light house green water under small city north open paper field".split()


class Recorder:
    """The JSON document: ``meta`` and one entry per phase, written atomically after each change."""

    def __init__(self, out: Path, torch: Any, budget_s: float, skip: tuple[str, ...] = ()) -> None:
        self.path, self.torch, self.budget_s, self.skip = out / RESULT, torch, budget_s, skip
        self.cuda = torch.cuda.is_available()
        self.start = time.perf_counter()
        self.doc: dict[str, Any] = {"meta": {}, "phases": {}}

    def write(self) -> None:
        write_json_atomic(self.path, self.doc)

    def memory(self) -> dict[str, Any]:
        """Device memory now (``None`` on CPUs) and the process's resident memory."""
        rss = os.sysconf("SC_PAGE_SIZE") * int(Path("/proc/self/statm").read_text().split()[1])
        if not self.cuda:
            return {"rss_bytes": rss, "allocated_bytes": None, "free_bytes": None, "total_bytes": None}
        free, total = self.torch.cuda.mem_get_info()
        return {"rss_bytes": rss, "allocated_bytes": self.torch.cuda.memory_allocated(),
                "free_bytes": free, "total_bytes": total}  # fmt: skip

    def run(self, name: str, body: Callable[[dict[str, Any]], None]) -> None:
        """Run one phase: its record gets ``status`` (ok / error / skipped), numbers and any error."""
        record: dict[str, Any] = {"status": "running"}
        self.doc["phases"][name] = record
        elapsed = time.perf_counter() - self.start
        late = f"{elapsed:.0f} s elapsed > --budget-s {self.budget_s:.0f}" if elapsed > self.budget_s else ""
        if name in self.skip or late:
            record.update(status="skipped", reason="--skip" if name in self.skip else late)
            return self.write()
        self.write()
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()
        began = time.perf_counter()
        try:
            body(record)
            record["status"] = "ok"
        except Exception as exc:  # recorded, and the next phase runs: one run yields every finding
            oom = isinstance(exc, self.torch.cuda.OutOfMemoryError) or "out of memory" in str(exc)
            record.update(status="error", error=f"{type(exc).__name__}: {str(exc)[:2000]}", oom=oom)
        record["seconds"] = time.perf_counter() - began
        record["peak_allocated_bytes"] = self.torch.cuda.max_memory_allocated() if self.cuda else None
        record["after"] = self.memory()
        self.write()


def engine_check(torch: Any, utilization: float) -> dict[str, Any]:
    """Where a colocated vLLM engine would start now: free memory as left, then after what vLLM V1's
    worker does first (``gc.collect()``, ``empty_cache()``), against ``utilization x total``."""
    if not torch.cuda.is_available():
        gc.collect()
        return {"utilization": utilization, "would_start": None, "reason": "no CUDA device"}
    free_as_left, total = torch.cuda.mem_get_info()
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    required = utilization * total
    return {
        "utilization": utilization, "total_bytes": total, "required_bytes": int(required),
        "free_as_left_bytes": free_as_left, "free_after_gc_bytes": free,
        "allocated_after_gc_bytes": torch.cuda.memory_allocated(),
        "would_start_as_left": free_as_left >= required, "would_start": free >= required,
    }  # fmt: skip


def _text(tokenizer: Any, tokens: int, offset: int) -> str:
    """About ``tokens`` tokens of plain words (the decoded first ``tokens`` ids of a word list)."""
    words = " ".join(_WORDS[(offset + 3 * i) % len(_WORDS)] for i in range(tokens + 8))
    return tokenizer.decode(tokenizer(words, add_special_tokens=False)["input_ids"][:tokens]).strip()


def _chat_tokens(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def dpo_pair(tokenizer: Any, plan: Plan) -> tuple[Any, dict[str, int]]:
    """One preference pair whose prompt + chosen and prompt + rejected each render to about
    ``plan.dpo_tokens`` tokens under the chat template (the counts are returned)."""
    from optima_trainers.dpo.records import PreferencePair

    def build(prompt_tokens: int) -> Any:
        prompt = ({"role": "system", "content": _text(tokenizer, 16, 0)},
                  {"role": "user", "content": _text(tokenizer, prompt_tokens, 1)})  # fmt: skip
        return PreferencePair(
            prompt=prompt, chosen=_text(tokenizer, plan.dpo_completion, 2),
            rejected=_text(tokenizer, plan.dpo_completion, 4), chosen_value=1.0, rejected_value=0.0,
            task_id="gpu-check", sample_id="gpu-check-0", instance_index=0, depth=0, agent="Alice",
        )  # fmt: skip

    def lengths(pair: Any) -> dict[str, int]:
        prompt = [dict(m) for m in pair.prompt]
        return {s: _chat_tokens(tokenizer, [*prompt, {"role": "assistant", "content": getattr(pair, s)}])
                for s in ("chosen", "rejected")}  # fmt: skip

    first = build(plan.dpo_tokens - plan.dpo_completion - 16)
    over = max(lengths(first).values()) - plan.dpo_tokens
    pair = build(plan.dpo_tokens - plan.dpo_completion - 16 - max(over, 0))
    return pair, lengths(pair)


class Check:
    """The phases and what they share (paths of the model folders, the configuration)."""

    def __init__(self, rec: Recorder, plan: Plan, tokenizer_path: Path, work: Path) -> None:
        from optima_trainers.config.presets import PROFILES
        from optima_trainers.config.train import TrainConfig
        from optima_trainers.sft.trainer import checkpointing_for

        self.rec, self.plan, self.work, self.torch = rec, plan, work, rec.torch
        self.tokenizer = require("transformers", "train").AutoTokenizer.from_pretrained(tokenizer_path)
        self.tokenizer_path = tokenizer_path
        config = TrainConfig(task="gpu-check", trainer="isft", profile="paper").replace(**PROFILES["paper"])
        cuda = rec.cuda
        self.dtype = config.dtype if config.dtype != "auto" else ("bfloat16" if cuda else "float32")
        self.utilization = config.generation.vllm_gpu_memory_utilization
        self.sft = dataclasses.replace(
            config.sft, max_steps=plan.sft_steps, batch_size=plan.sft_batch, max_length=plan.sft_tokens,
            gradient_checkpointing=checkpointing_for(config.sft.gradient_checkpointing, cuda),
        )  # fmt: skip
        self.dpo = dataclasses.replace(
            config.dpo, max_steps=1, batch_size=1, per_device_batch_size=1, max_length=plan.dpo_tokens,
            evaluate=False, gradient_checkpointing=checkpointing_for(config.dpo.gradient_checkpointing, cuda),
        )  # fmt: skip
        self.model_dir, self.model = work / "base", None

    def environment(self, record: dict[str, Any]) -> None:
        torch = self.torch
        versions = {}
        for name in ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "pyarrow"):
            try:
                versions[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                versions[name] = None
        record.update(python=platform.python_version(), versions=versions, dtype=self.dtype,
                      device=torch.cuda.get_device_name(0) if self.rec.cuda else "cpu",
                      sft=dataclasses.asdict(self.sft), dpo=dataclasses.asdict(self.dpo),
                      utilization=self.utilization, before=self.rec.memory(), work_dir=str(self.work),
                      work_disk_free_bytes=shutil.disk_usage(self.work).free)  # fmt: skip
        require("trl", "train")  # fails the phase (recorded) when the carried wheels are missing
        require("datasets", "train")

    def build_model(self, record: dict[str, Any]) -> None:
        torch, transformers = self.torch, require("transformers", "train")
        tok = self.tokenizer
        config = transformers.LlamaConfig(
            **SHAPES[self.plan.shape], vocab_size=len(tok), max_position_embeddings=8192,
            rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        )  # fmt: skip
        torch.manual_seed(0)
        with torch.device("cuda" if self.rec.cuda else "cpu"):  # initialised where it trains: fast
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, self.dtype))
        record.update(parameters=sum(p.numel() for p in model.parameters()), vocab_size=len(tok),
                      shape=SHAPES[self.plan.shape], dtype=self.dtype)  # fmt: skip
        model.save_pretrained(self.model_dir)
        tok.save_pretrained(self.model_dir)
        self.model = model  # the readability phase scores with it (as the loop's frozen base model)
        record["weights_bytes"] = sum(f.stat().st_size for f in self.model_dir.glob("*.safetensors"))
        record["engine"] = engine_check(torch, self.utilization)

    def sft_stage(self, index: int) -> Callable[[dict[str, Any]], None]:
        def body(record: dict[str, Any]) -> None:
            from optima_trainers.sft.data import MaskedExample
            from optima_trainers.sft.trainer import train_sft

            rng, n = random.Random(index), self.plan.sft_tokens
            vocab = len(self.tokenizer)
            examples = [
                MaskedExample(input_ids=tuple(rng.randrange(vocab) for _ in range(n)),
                              assistant_masks=(0,) * (n // 4) + (1,) * (n - n // 4),
                              sample_id=f"gpu-check-{index}-{i}", agent="Alice")
                for i in range(self.plan.sft_steps * self.plan.sft_batch)
            ]  # fmt: skip
            start, target = self.model_dir, self.work / f"sft_{index}"
            result = train_sft(model_path=str(start), examples=examples, config=self.sft,
                               output_dir=target, seed=index, dtype=self.dtype)  # fmt: skip
            self.model_dir = target
            record.update(examples=len(examples), tokens_per_example=n, steps=result.steps,
                          train_loss=result.train_loss, trainer_metrics=dict(result.metrics))  # fmt: skip
            record["engine"] = engine_check(self.torch, self.utilization)
            shutil.rmtree(start, ignore_errors=True)  # the disk holds at most two 16 GB folders

        return body

    def dpo_step(self, record: dict[str, Any]) -> None:
        from optima_trainers.dpo.trainer import train_dpo

        pair, lengths = dpo_pair(self.tokenizer, self.plan)
        target = self.work / "dpo"
        result = train_dpo(model_path=str(self.model_dir), pairs=[pair], config=self.dpo,
                           output_dir=target, dtype=self.dtype)  # fmt: skip
        record.update(tokens=lengths, steps=result.steps, train_loss=result.train_loss,
                      trainer_metrics={k: v for k, v in result.metrics.items() if isinstance(v, float)},
                      )  # fmt: skip
        record["engine"] = engine_check(self.torch, self.utilization)
        shutil.rmtree(target, ignore_errors=True)

    def readability(self, record: dict[str, Any]) -> None:
        from optima_env.models import load_tokenizer
        from optima_env.readability import TransformersLMLoss

        if self.model is None:
            raise RuntimeError("no model to score with: build_model failed")
        tokenizer = load_tokenizer(self.model_dir)
        scorer, self.model = TransformersLMLoss(self.model, tokenizer), None
        texts = [_text(tokenizer, self.plan.turn_tokens - 8 * (i % 4), i) for i in range(self.plan.turns)]
        began = time.perf_counter()
        losses = scorer(texts)
        record.update(turns=len(losses), tokens_per_turn=self.plan.turn_tokens,
                      score_seconds=time.perf_counter() - began,
                      mean_loss=sum(losses) / len(losses), batch_size=getattr(scorer, "batch_size", None),
                      )  # fmt: skip
        record["engine_with_scorer_loaded"] = engine_check(self.torch, self.utilization)
        del scorer
        record["engine"] = engine_check(self.torch, self.utilization)


PHASES = ("environment", "build_model", "readability", "sft_stage_1", "sft_stage_2", "dpo_step")
"""In the loop's order: the frozen base model scores, then the stages train."""


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
                  "dpo_step": check.dpo_step, "readability": check.readability}  # fmt: skip
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
