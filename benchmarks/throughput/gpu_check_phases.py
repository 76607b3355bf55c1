"""The phases of the device check (:mod:`benchmarks.throughput.gpu_check`, whose docstring says
what each measures): the model shapes and sizes, the JSON recorder, and one method per phase."""

from __future__ import annotations

import dataclasses
import gc
import importlib.metadata
import json
import os
import platform
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optima_env.errors import require
from optima_env.io import write_json_atomic

__all__ = ["PHASES", "PLANS", "RESULT", "SHAPES", "Check", "Plan", "Recorder", "dpo_pair", "engine_check"]

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
    vocab: int | None
    """The model's vocabulary (``None``: the tokenizer's)."""
    sft_tokens: int
    """Tokens of each SFT example (the paper profile's ``sft.max_length`` at the 8B shape)."""
    sft_steps: int = 2
    sft_batch: int = 2
    """``sft.batch_size`` (one example per forward pass, as the paper profile; accumulation 2)."""
    dpo_tokens: int = 4096
    """Prompt + completion tokens of each side of the DPO pair."""
    dpo_completion: int = 256
    turn_tokens: int = 2000
    """Tokens of each scored turn (the paper profile's ``generation.max_new_tokens``: the longest)."""
    turns: int = 64


PLANS = {
    "llama3-8b": Plan("llama3-8b", vocab=128256, sft_tokens=2048),
    "tiny": Plan("tiny", vocab=None, sft_tokens=128, dpo_tokens=256, dpo_completion=32, turn_tokens=32),
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
    from optima_trainers.run.records import PreferencePair

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
        from optima_trainers.run.trl import checkpointing_for

        self.rec, self.plan, self.work, self.torch = rec, plan, work, rec.torch
        self.tokenizer = require("transformers", "train").AutoTokenizer.from_pretrained(tokenizer_path)
        self.tokenizer_path = tokenizer_path
        config = TrainConfig(task="gpu-check", trainer="isft", profile="paper").replace(**PROFILES["paper"])
        self.config = config
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
            **SHAPES[self.plan.shape], vocab_size=self.plan.vocab or len(tok), max_position_embeddings=8192,
            rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        )  # fmt: skip
        torch.manual_seed(0)
        with torch.device("cuda" if self.rec.cuda else "cpu"):  # initialised where it trains: fast
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, self.dtype))
        record.update(parameters=sum(p.numel() for p in model.parameters()), vocab_size=config.vocab_size,
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

    def fork(self, record: dict[str, Any]) -> None:
        import multiprocessing

        self.torch.cuda.is_available()  # as the trainers do before an engine starts
        for method in ("fork", "spawn"):
            queue = multiprocessing.get_context(method).Queue()
            child = multiprocessing.get_context(method).Process(target=_touch_cuda, args=(queue,))
            child.start()
            child.join(timeout=120)
            record[method] = queue.get(timeout=5) if child.exitcode == 0 else f"exit code {child.exitcode}"

    def tree(self, record: dict[str, Any]) -> None:
        from optima_env.models import load_model
        from optima_env.readability import TransformersLMLoss
        from optima_trainers.run.memory_plan import ModelShape, plan_memory

        torch = self.torch
        config = json.loads((self.model_dir / "config.json").read_text(encoding="utf-8"))
        total = torch.cuda.mem_get_info()[1] if self.rec.cuda else None
        plan_config = self.config.replace(  # the tree phase checks the scorer beside the engine
            trainer="idpo", **{"generation.backend": "vllm", "generation.vllm_weights": "in_place"}
        )
        fitted = plan_memory(plan_config, ModelShape.from_config(config), total or 80e9).max_utilization
        record.update(default_utilization=self.utilization, planned_utilization=fitted)
        for name, utilization in (("default", self.utilization), ("planned", fitted)):
            if total is None:
                record[name] = {"utilization": utilization, "fits": None, "reason": "no CUDA device"}
                continue
            held = scorer = None
            try:
                held = torch.empty(int(utilization * total), dtype=torch.uint8, device="cuda")
                model, tokenizer = load_model(str(self.model_dir), dtype=self.dtype)
                scorer = TransformersLMLoss(model, tokenizer)
                scorer([_text(tokenizer, self.plan.turn_tokens, i) for i in range(4)])
                peak = torch.cuda.max_memory_allocated()
                record[name] = {"utilization": utilization, "fits": True, "peak_allocated_bytes": peak}
            except torch.cuda.OutOfMemoryError as exc:
                record[name] = {"utilization": utilization, "fits": False, "error": str(exc)[:500]}
            finally:
                del held, scorer
                gc.collect()
                torch.cuda.empty_cache()


def _touch_cuda(queue: Any) -> None:
    """In a child process: put ``"ok"`` when CUDA works here, else the error (``"no CUDA"`` without one)."""
    try:
        import torch

        if not torch.cuda.is_available():
            queue.put("no CUDA")
            return
        torch.zeros(1, device="cuda").add_(1).item()
        queue.put("ok")
    except Exception as exc:
        queue.put(f"{type(exc).__name__}: {str(exc)[:300]}")


PHASES = ("environment", "fork", "build_model", "readability", "tree", "sft_stage_1", "sft_stage_2",
          "dpo_step")  # fmt: skip
"""In the loop's order: the frozen base model scores, then the stages train."""
