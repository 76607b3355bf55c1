"""``python -m benchmarks.run --suite handoff``: from "stage trained" to the next stage's first token.

Issue #29: how a stage's new weights reach the vLLM engine that generates the next stage. On
vLLM-CPU, side by side in one run, from the same trained model (the base model with a LoRA adapter
of the trainer's shape, ``sft.lora_r``/``sft.lora_alpha`` on every linear layer, whose ``lora_B``
is drawn at random so that the weights differ from the base), in memory as a stage leaves it:

* ``reload`` (the path before #29, ``generation.vllm_reuse_engine=false``): merge and save the
  checkpoint (:func:`optima_trainers.run.checkpoint.atomic_checkpoint`), hash it as it is written,
  hash it again before the next stage loads it (:func:`~optima_trainers.run.checkpoint.require_complete`),
  start a new engine on it;
* ``in_place`` (the default): merge, save and hash once as written, then
  :meth:`optima_env.backends.vllm.VLLMPolicy.load_weights` into the engine that generated the
  previous stage (vLLM's ``reload_weights`` and a prefix-cache reset);
* ``lora`` (vLLM LoRA serving, no merge): save the adapter alone, hash it, add it to an engine
  started with ``enable_lora`` (``LLMEngine.add_lora``) and ask for it with a ``LoRARequest``.

Each step is timed, then the first token of a greedy request (the prompt the previous stage's
engine had already served, so a stale prefix cache would show). Each (path, repetition) runs in
its own process (``python -m benchmarks.throughput.handoff_bench SPEC``): a vLLM engine is not
torn down cleanly in-process, and each process's peak RSS (its own plus the engine's processes,
sampled every 50 ms) is then the path's own. The engines (the untimed one a path starts from and
the timed one of ``reload``) start with the same options (:data:`ENGINE`), torch uses one
thread, and the paths alternate within each repetition so that the machine's load falls on all
of them; the table gives medians over the repetitions (``--episodes N``, default 3), the ratios
of the medians measured in this run, and the load average around each measurement.

Writes ``results.json`` and ``results.md``, and each measurement as it ends into
``rows/<path>-<repetition>.json`` (a rerun with the same ``--out`` keeps them); the checkpoints
live in a temporary folder removed at the end.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from optima_env.errors import BackendError
from optima_env.io import write_json_atomic, write_text_atomic

__all__ = ["ENGINE", "PATHS", "STEPS", "run_handoff_suite"]

PATHS = ("reload", "in_place", "lora")
LABELS = {
    "reload": "merge + save + hash + re-hash, new engine (before #29)",
    "in_place": "merge + save + hash once, load_weights in place (default)",
    "lora": "adapter save + hash, LoRARequest on a running enable_lora engine",
}
STEPS = {
    "reload": ("save", "hash", "verify", "engine_start", "first_token"),
    "in_place": ("save", "hash", "load", "first_token"),
    "lora": ("save", "hash", "load", "first_token"),
}
STEP_LABELS = {
    "save": "merge/save (lora: adapter save)",
    "hash": "hash as written",
    "verify": "re-hash before loading",
    "engine_start": "engine start",
    "load": "load weights / adapter",
    "first_token": "first token",
}
ENGINE = {"dtype": "float32", "max_model_len": 1024, "gpu_memory_utilization": 0.2, "cpu_kvcache_gb": 1}
"""The vLLM options of every engine the benchmark starts (vLLM-CPU: eager, 1 GiB of KV cache)."""
WITNESS_TOKENS = 16
"""After the timing, each path's engine writes this many greedy tokens (untimed), and the report
compares them with the reply of the engine before the handoff (base weights): the handoff
delivered the trained weights if they differ."""
PROMPT = (
    "You are Alice. Work with your partner Bob to answer: where is the company that Lojal Garbru "
    "works for headquartered? Your fact: Lojal Garbru works for Vantor Labs. "
    'Begin your response with "Alice:".'
)


def run_handoff_suite(
    out_dir: str | Path, *, model: str = "embedded", seed: int = 0, repetitions: int = 3, command: str = ""
) -> dict[str, Any]:
    """Measure every path ``repetitions`` times; write ``results.json`` and ``results.md`` (which
    quotes ``command``, the command line that ran it) into ``out_dir``; returns the results dict."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="optima-handoff-") as tmp:
        work = Path(tmp)
        adapter = None
        for rep in range(repetitions):
            for path in PATHS:
                kept = out / "rows" / f"{path}-{rep}.json"  # a rerun with the same --out keeps finished rows
                row = json.loads(kept.read_text(encoding="utf-8")) if kept.is_file() else None
                if row is None or (row["model"], row["seed"]) != (model, seed) or "reply" not in row:
                    adapter = adapter or _prepare_adapter(model, work / "trained-adapter", seed=seed)
                    name = work / f"{path}-{rep}"
                    spec = {"path": path, "model": model, "adapter": str(adapter), "rank": adapter_rank(),
                            "checkpoint": str(name), "result": f"{name}.json"}  # fmt: skip
                    row = {"path": path, "repetition": rep, "model": model, "seed": seed,
                           **_run_worker(spec, work / f"{path}-{rep}.log")}  # fmt: skip
                    write_json_atomic(kept, row)
                rows.append(row)
                print(f"handoff {path} #{rep}: {row['total_s']:.2f} s, peak RSS {row['peak_rss_mib']:.0f} "
                      f"MiB, load {row['load_before'][0]:.1f}", flush=True)  # fmt: skip
    results = _summarize(rows, model=model, repetitions=repetitions)
    bases = {r["base_reply"] for r in rows if r.get("base_reply")}
    results["base_reply"] = sorted(bases)
    replies = {r["reply"] for r in rows}
    results["new_weights_answer"] = bool(bases) and not bases & replies
    results["same_reply_every_path"] = len(replies) == 1
    results.update(wall_time_s=time.time() - started, command=command)
    write_json_atomic(out / "results.json", results)
    text = report(results)
    write_text_atomic(out / "results.md", text)
    print(text)
    return results


def adapter_rank() -> tuple[int, int]:
    """``(r, alpha)`` of the trainer's default LoRA
    (:class:`optima_trainers.config.training.SFTTrainConfig`)."""
    from optima_trainers.config.training import SFTTrainConfig

    defaults = SFTTrainConfig()
    return defaults.lora_r, defaults.lora_alpha


def _prepare_adapter(model: str, folder: Path, *, seed: int) -> Path:
    """Save the "trained" adapter: the trainer's LoRA on ``model`` with random ``lora_B``."""
    import peft
    import torch
    import transformers

    from optima_env.models import resolve_model_path
    from optima_trainers.run.trl import lora_config

    torch.set_num_threads(1)
    base = transformers.AutoModelForCausalLM.from_pretrained(resolve_model_path(model), dtype=torch.float32)
    torch.manual_seed(seed)  # lora_A's initialization
    wrapped = peft.get_peft_model(base, lora_config(*adapter_rank()))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:  # zero at init: a trained adapter has moved it
                param.copy_(torch.randn(param.shape, generator=generator) * 0.01)
    wrapped.save_pretrained(folder)
    return folder


def _run_worker(spec: dict[str, Any], log: Path) -> dict[str, Any]:
    """One (path, repetition) in a fresh process; its measured row."""
    spec_path = Path(spec["result"]).with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "benchmarks.throughput.handoff_bench", str(spec_path)]
    with open(log, "w", encoding="utf-8") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                              cwd=Path(__file__).resolve().parents[2], check=False)  # fmt: skip
    if done.returncode != 0 or not Path(spec["result"]).is_file():
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise BackendError(
            f"the handoff benchmark's {spec['path']!r} process failed (exit {done.returncode}); "
            f"the end of its log:\n{tail}"
        )
    return json.loads(Path(spec["result"]).read_text(encoding="utf-8"))


# -- the worker (one path, one repetition, in its own process) ------------------------------------
class _PeakRss:
    """The peak RSS of this process plus its children (vLLM's engine processes), sampled."""

    def __init__(self, every_s: float = 0.05) -> None:
        import psutil

        self._process = psutil.Process()
        self._every = every_s
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def current(self) -> int:
        total = 0
        for process in [self._process, *self._process.children(recursive=True)]:
            try:
                total += process.memory_info().rss
            except Exception:  # a child that just ended
                continue
        return total

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.current())
            self._stop.wait(self._every)

    def reset(self) -> None:
        self.peak = self.current()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self.current())


def _engine(model: str, *, lora_rank: int | None = None) -> Any:
    from optima_env.backends.loading import load_policy

    extra = {} if lora_rank is None else {"enable_lora": True, "max_lora_rank": lora_rank, "max_loras": 2}
    return load_policy(model, backend="vllm", **ENGINE, **extra)


def _first_token(engine: Any, request: Any, lora: Any = None, *, tokens: int = 1) -> str:
    """The greedy first token of ``request`` (the policy's own ``generate``; with a LoRA request
    vLLM's ``LLM.generate``, which the policy does not expose, on the same rendered prompt)."""
    from optima_env.policy import SamplingParams

    if lora is None:
        return engine.generate([request], SamplingParams(temperature=0.0, max_new_tokens=tokens))[0]
    import vllm
    from vllm.inputs import TokensPrompt

    from optima_env.backends.hf import render_prompt

    ids = engine.tokenizer(render_prompt(engine.tokenizer, request), add_special_tokens=False)["input_ids"]
    params = vllm.SamplingParams(temperature=0.0, max_tokens=tokens, skip_special_tokens=True)
    prompt = TokensPrompt(prompt_token_ids=ids)
    output = engine.llm.generate([prompt], params, use_tqdm=False, lora_request=lora)
    return request.prefix + output[0].outputs[0].text


def _stage_end(spec: dict[str, Any]) -> tuple[Any, Any, Any, Any, str | None]:
    """``(model, tokenizer, engine, request, base reply)`` as a stage leaves them: the trained LoRA
    model in memory and, but for ``reload``, the engine that generated the stage (base weights),
    which has served ``request`` (its greedy reply of :data:`WITNESS_TOKENS` tokens)."""
    import peft
    import torch
    import transformers

    from optima_env.models import load_tokenizer, resolve_model_path
    from optima_env.policy import GenerationRequest

    base = resolve_model_path(spec["model"])
    messages = [{"role": "system", "content": PROMPT}]
    request = GenerationRequest(messages=messages, prefix="Alice:", agent="Alice")
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(model, spec["adapter"])
    engine = reply = None
    if spec["path"] != "reload":
        engine = _engine(base, lora_rank=spec["rank"][0] if spec["path"] == "lora" else None)
        reply = _first_token(engine, request, tokens=WITNESS_TOKENS)
    return model, load_tokenizer(base), engine, request, reply


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one path: from the end of a stage (:func:`_stage_end`) to the first token."""
    import torch

    from optima_trainers.run.checkpoint import TrainResult, atomic_checkpoint, require_complete

    torch.set_num_threads(1)
    rss = _PeakRss()
    path, checkpoint = spec["path"], Path(spec["checkpoint"])
    model, tokenizer, engine, request, base_reply = _stage_end(spec)
    load_before = os.getloadavg()
    rss.reset()
    steps: dict[str, float] = {}
    started = last = time.perf_counter()

    def mark(step: str) -> None:
        nonlocal last
        now = time.perf_counter()
        steps[step] = now - last
        last = now

    with atomic_checkpoint(checkpoint) as (tmp, finish):
        if path == "lora":
            model.save_pretrained(tmp)  # the adapter alone
        else:
            model.merge_and_unload().save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        del model
        mark("save")
        finish(TrainResult(checkpoint=str(checkpoint), train_loss=None, steps=0, num_examples=0))
    mark("hash")
    lora = None
    if path == "reload":
        require_complete(checkpoint)
        mark("verify")
        engine = _engine(str(checkpoint))
        mark("engine_start")
    elif path == "in_place":
        engine.load_weights(str(checkpoint))
        mark("load")
    else:
        from vllm.lora.request import LoRARequest

        lora = LoRARequest("stage", 1, str(checkpoint))
        engine.llm.llm_engine.add_lora(lora)
        mark("load")
    first = _first_token(engine, request, lora)
    mark("first_token")
    total = time.perf_counter() - started
    peak = rss.stop()
    load_after = os.getloadavg()
    reply = _first_token(engine, request, lora, tokens=WITNESS_TOKENS)  # untimed: the new weights answer
    engine.close()
    return {"steps": steps, "total_s": total, "first_token": first, "reply": reply, "base_reply": base_reply,
            "peak_rss_mib": peak / 2**20, "load_before": list(load_before),
            "load_after": list(load_after)}  # fmt: skip


# -- the report -----------------------------------------------------------------------------------
def _summarize(rows: list[dict[str, Any]], *, model: str, repetitions: int) -> dict[str, Any]:
    medians = {}
    for path in PATHS:
        mine = [r for r in rows if r["path"] == path]
        medians[path] = {
            "steps": {s: statistics.median(r["steps"][s] for r in mine) for s in STEPS[path]},
            "total_s": statistics.median(r["total_s"] for r in mine),
            "total_min_s": min(r["total_s"] for r in mine),
            "total_max_s": max(r["total_s"] for r in mine),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in mine),
            "first_tokens": sorted({r["first_token"] for r in mine}),
        }
    ratios = {f"reload / {p}": medians["reload"]["total_s"] / medians[p]["total_s"] for p in PATHS[1:]}
    loads = [r[k][0] for r in rows for k in ("load_before", "load_after")]
    import vllm

    return {
        "suite": "handoff",
        "model": model,
        "repetitions": repetitions,
        "engine": {**ENGINE, "vllm": vllm.__version__, "enforce_eager": True},
        "lora_rank_alpha": list(adapter_rank()),
        "rows": rows,
        "medians": medians,
        "ratios": ratios,
        "same_first_token": len({t for m in medians.values() for t in m["first_tokens"]}) == 1,
        "load_average_1min": {"min": min(loads), "max": max(loads)},
        "cpu_count": os.cpu_count(),
    }


def report(results: dict[str, Any]) -> str:
    """The markdown table of :func:`run_handoff_suite`'s results."""
    medians = results["medians"]
    steps = list(STEP_LABELS)
    lines = [
        f'Stage handoff on vLLM-CPU {results["engine"]["vllm"]}: seconds from "stage trained" (the trained '
        f"LoRA model in memory) to the first token of the next stage, model `{results['model']}` (fp32, "
        f"LoRA r={results['lora_rank_alpha'][0]}), median of {results['repetitions']} repetitions per path, "
        f"each in its own process, paths alternating, torch 1 thread. Load average (1 min) during the run: "
        f"{results['load_average_1min']['min']:.1f}-{results['load_average_1min']['max']:.1f} on "
        f"{results['cpu_count']} cores (shared machine: absolute times are noisy, the ratios are of one "
        "run).",
        "",
        "| path | "
        + " | ".join(f"{STEP_LABELS[s]} s" for s in steps)
        + " | total s (min-max) | peak RSS MiB |",
        "|---|" + "---|" * (len(steps) + 2),
    ]
    for path in PATHS:
        m = medians[path]
        cells = " | ".join(f"{m['steps'][s]:.2f}" if s in m["steps"] else "-" for s in steps)
        lines.append(
            f"| {path}: {LABELS[path]} | {cells} | {m['total_s']:.2f} "
            f"({m['total_min_s']:.2f}-{m['total_max_s']:.2f})"
            f" | {m['peak_rss_mib']:.0f} |"
        )
    lines += ["", "| ratio of the median totals (same run) | value |", "|---|---|"]
    lines += [f"| {name} | {value:.1f}x |" for name, value in results["ratios"].items()]
    firsts = {p: medians[p]["first_tokens"] for p in PATHS}
    same = results["same_first_token"]
    lines += ["", f"First tokens (greedy): {json.dumps(firsts)}; the same on every path: {same}."]
    replies = json.dumps(sorted({r["reply"] for r in results["rows"]}))
    lines += ["", f"Greedy replies of {WITNESS_TOKENS} tokens after the handoff (untimed): {replies}; the "
              f"base weights' (the engines before the handoff): {json.dumps(results['base_reply'])}; the "
              f"trained weights answer on every path: {results['new_weights_answer']}; the same reply on "
              f"every path: {results['same_reply_every_path']}."]  # fmt: skip
    lines += ["", "Peak RSS: the measuring process plus the engine's processes, sampled every 50 ms during "
              "the handoff."]  # fmt: skip
    if results.get("command"):
        lines += ["", f"Command: `{results['command']}` ({results['wall_time_s'] / 60:.1f} min)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # the worker process (vLLM spawns its engine: keep this guard)
    _spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    write_json_atomic(Path(_spec["result"]), _worker(_spec))
