"""A run's GPU memory plan, computed before the first token: each phase's peak on one GPU.

On a GPU the phases of a run share the card one after the other. What is resident in each:

* ``engine start`` / ``engine wake`` (every sampled and tree stage): vLLM claims
  ``generation.vllm_gpu_memory_utilization`` x total (weights, activations, KV cache) and refuses
  to start or wake unless that much is free, so everything else must fit in the rest: this
  process's CUDA context (the readability scorer leaves before every start and wake).
* ``engine KV cache``: what vLLM keeps of its share after the weights and its activation profile
  must hold at least one sequence of ``max_model_len`` tokens, or vLLM refuses to start.
* ``score`` (sampled stages): the sleeping engine's remainder, the context, the frozen scorer's
  weights and one scoring batch.
* ``tree`` (iDPO and iSFT-DPO's tree stages): the awake engine *and* the scorer, which rewards
  the tree's leaves while the engine expands it.
* ``sft`` / ``dpo``: the sleeping engine's remainder, the context, the policy's weights, the
  trainable state (LoRA, or the full model's gradients and Adam states, sharded by ZeRO), the
  activations (each layer's input with gradient checkpointing) and the loss's logits; a DPO step
  holds both sides of a pair. With LoRA the reference is the base with the adapter off; full
  fine-tuning keeps a reference copy only without ``dpo.precompute_ref_log_probs`` (on by
  default: the reference log-probs are computed before training, with the policy's own weights).

That is the ``in_place`` design (``generation.vllm_weights``,
:func:`~optima_trainers.config.sections.resolve_vllm_weights`). In the ``adapters`` design (the
default on a GPU with LoRA training) the engine holds the base and scores readability itself, so
no scorer copy is planned anywhere. Its share also holds ``max_loras`` LoRA slots at
``max_lora_rank`` (:func:`~optima_env.backends.vllm_lora.lora_engine_options`, at the run's last
stage's rank), which the KV cache gives up; ``score`` and ``tree`` are the awake engine and,
outside its share, the logits of the longest scored turn (``max_new_tokens``, at most the
scorer's 2048 tokens) that vLLM computes for ``prompt_logprobs`` beside its memory profile.

The arithmetic is the README's ("The device check": W, L, A, G, R, F), in GB = 10^9 bytes. The
constants below that no formula gives (the CUDA context, a sleeping engine's remainder, vLLM's
activation profile) are estimates, named here once so that a measurement on a GPU replaces them
in one place. :func:`plan_memory` returns the phases; :meth:`MemoryPlan.fitted` lowers
``vllm_gpu_memory_utilization`` when it is the default and a phase needs it lower, and
:meth:`MemoryPlan.check` raises one line per phase that does not fit, naming the shortfall and
the setting that fixes it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optima_env.backends.vllm_lora import MAX_LORAS, lora_slot_rank
from optima_env.errors import ConfigError
from optima_trainers.config.sections import lora_stage_rank, resolve_vllm_weights

__all__ = ["MemoryPlan", "ModelShape", "Phase", "plan_memory", "plan_run"]

GB = 1e9
CUDA_CONTEXT_GB = 0.5
"""A process's CUDA context and torch's workspace (estimate)."""
ENGINE_ASLEEP_GB = 1.0
"""What a vLLM engine keeps on the GPU asleep at level 1 (its process's CUDA context; the
weights went to host memory, the KV cache was dropped): estimate."""
ENGINE_ACTIVATIONS_GB = 2.0
"""vLLM's activation profile and CUDA graphs inside its share (estimate)."""
LOGIT_BYTES = 2 + 4 + 4
"""Per logit of the loss: bf16, its fp32 upcast and the fp32 log-softmax."""
LORA_BYTES = 16
"""Per LoRA parameter: fp32 weight, gradient and two Adam moments."""
FULL_STATE_BYTES = 2 + 12
"""Per parameter of full fine-tuning beyond the bf16 weights: bf16 gradient, fp32 master weight
and two fp32 Adam moments (ZeRO-2 and ZeRO-3 shard these over the processes)."""
SCORED_TOKENS = 2048
"""The longest turn the readability scorers score (their ``max_length``)."""
DEFAULT_UTILIZATION = 0.9
"""``GenerationConfig.vllm_gpu_memory_utilization``'s default, which :meth:`MemoryPlan.fitted` may lower."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The sizes of a Llama-style decoder that the plan needs, read from its ``config.json``."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    context: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """From a transformers config dict (a multimodal one's ``text_config``)."""
        config = config.get("text_config") or config
        try:
            hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            return cls(
                hidden=hidden,
                layers=int(config["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate=int(config["intermediate_size"]),
                vocab=int(config["vocab_size"]),
                tied=bool(config.get("tie_word_embeddings", False)),
                context=config.get("max_position_embeddings"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"the memory plan needs a decoder config with hidden_size, num_hidden_layers, "
                f"num_attention_heads, intermediate_size and vocab_size; got keys {sorted(config)} ({exc})"
            ) from exc

    @property
    def params(self) -> int:
        """Parameters: embeddings (twice unless tied), attention, the gated MLP, the norms."""
        attention = 2 * self.hidden * (self.heads + self.kv_heads) * self.head_dim
        block = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * block + self.hidden

    def lora_params(self, rank: int) -> int:
        """LoRA of rank ``rank`` on every linear layer of the blocks (``all-linear``)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        pairs = [(self.hidden, q), (self.hidden, kv), (self.hidden, kv), (q, self.hidden)]
        pairs += [(self.hidden, self.intermediate)] * 2 + [(self.intermediate, self.hidden)]
        return self.layers * rank * sum(a + b for a, b in pairs)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    @property
    def activation_values(self) -> int:
        """Values a block keeps per token for its backward: 6 hidden-sized tensors, K and V, and 4
        of the MLP's width (83,968 at Llama 3 8B's shape)."""
        return 6 * self.hidden + 2 * self.kv_heads * self.head_dim + 4 * self.intermediate


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase's peak: its parts (name, GB) against the card's total."""

    name: str
    parts: tuple[tuple[str, float], ...]
    limit_gb: float
    fix: str

    @property
    def need_gb(self) -> float:
        return sum(gb for _, gb in self.parts)

    @property
    def fits(self) -> bool:
        return self.need_gb <= self.limit_gb

    def line(self) -> str:
        parts = " + ".join(f"{name} {gb:.2f}" for name, gb in self.parts)
        verdict = "fits" if self.fits else f"short by {self.need_gb - self.limit_gb:.2f} GB: {self.fix}"
        return f"{self.name}: {parts} = {self.need_gb:.2f} of {self.limit_gb:.2f} GB, {verdict}"


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """The phases of a run on one GPU of ``total_gb`` (every process of a multi-GPU run has one)."""

    total_gb: float
    world: int
    """Processes, one GPU each (each GPU holds what one process's phases need)."""
    utilization: float
    max_utilization: float
    """The highest ``vllm_gpu_memory_utilization`` (two decimals) at which every engine phase fits."""
    phases: tuple[Phase, ...]
    weights: str = "in_place"
    """The design planned: ``generation.vllm_weights`` resolved (``in_place`` or ``adapters``)."""

    def lines(self) -> list[str]:
        gpus = "one GPU" if self.world == 1 else f"each of {self.world} GPUs"
        head = (f"memory plan ({self.weights}), {gpus} of {self.total_gb:.1f} GB at "
                f"vllm_gpu_memory_utilization {self.utilization:.2f} (at most {self.max_utilization:.2f} "
                "fits):")  # fmt: skip
        return [head] + [f"  {phase.line()}" for phase in self.phases]

    def failing(self) -> list[Phase]:
        return [phase for phase in self.phases if not phase.fits]

    def fitted(self, config: Any) -> Any:
        """``config`` with ``generation.vllm_gpu_memory_utilization`` lowered to
        :attr:`max_utilization` when it is the default and an engine phase needs less; else as is."""
        util = config.generation.vllm_gpu_memory_utilization
        if util == DEFAULT_UTILIZATION and self.max_utilization < util and self.max_utilization > 0:
            return config.replace(**{"generation.vllm_gpu_memory_utilization": self.max_utilization})
        return config

    def check(self) -> None:
        """Raise :class:`ConfigError` with one line per phase that does not fit."""
        failing = self.failing()
        if failing:
            raise ConfigError(
                f"the run does not fit a GPU of {self.total_gb:.1f} GB (estimated before the first token; "
                "the memory plan above has each phase's parts): "
                + "; ".join(f"{p.name} short by {p.need_gb - p.limit_gb:.2f} GB: {p.fix}" for p in failing)
            )


def plan_memory(
    config: Any,
    shape: ModelShape,
    total_bytes: float,
    *,
    scorer_shape: ModelShape | None = None,
    world: int | None = None,
    zero_stage: int | None = None,
) -> MemoryPlan:
    """The plan of ``config`` (a :class:`~optima_trainers.config.train.TrainConfig`) for a model
    of ``shape`` on GPUs of ``total_bytes``.

    Args:
        scorer_shape: the readability model's shape (default: ``shape``, the base model).
        world: processes, one GPU each (default: ``WORLD_SIZE``, else 1).
        zero_stage: DeepSpeed ZeRO stage sharding full fine-tuning (default: accelerate's
            ``ACCELERATE_DEEPSPEED_ZERO_STAGE``, else none).
    """
    world = world or int(os.environ.get("WORLD_SIZE", "1"))
    if zero_stage is None and os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        zero_stage = int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "0"))
    total = total_bytes / GB
    gen = config.generation
    util = gen.vllm_gpu_memory_utilization
    dtype_bytes = 4 if config.dtype == "float32" else 2
    weights = shape.params * dtype_bytes / GB
    scorer = scorer_shape or shape
    context = CUDA_CONTEXT_GB
    tree = config.trainer in ("idpo", "isft-dpo")
    design = resolve_vllm_weights(config, cuda=True)
    slots = scoring = 0.0
    if design == "adapters":  # the engine scores: logits of the longest turn beside its share
        rank = lora_stage_rank(config)
        slots = MAX_LORAS * shape.lora_params(lora_slot_rank(rank or 1)) * dtype_bytes / GB
        scored = (
            "prompt_logprobs logits",
            min(gen.max_new_tokens, SCORED_TOKENS) * shape.vocab * LOGIT_BYTES / GB,
        )
        scoring = scored[1]
    else:  # the scorer's weights and one batch
        scored = ("scorer", scorer.params * dtype_bytes / GB + _scoring_batch_gb(scorer, dtype_bytes))
    beside = scoring if design == "adapters" else (scored[1] if tree else 0.0)
    max_util = math.floor(100 * (total - context - beside) / total) / 100
    lower = f"set generation.vllm_gpu_memory_utilization <= {max_util:.2f}"
    engine = util * total
    max_len = gen.max_model_len or shape.context or 8192
    kv = engine - weights - slots - ENGINE_ACTIVATIONS_GB
    sequence = max_len * shape.kv_bytes_per_token() / GB
    asleep = (("sleeping engine", ENGINE_ASLEEP_GB), ("CUDA context", context))
    awake = (("CUDA context", context), ("engine", engine))
    phases = [
        Phase("engine start/wake", awake, total, lower),
        Phase("engine KV cache", ((f"one {max_len}-token sequence", sequence),), max(kv, 0.0),
              "raise generation.vllm_gpu_memory_utilization or lower generation.max_model_len"),
        Phase("score", (*awake, scored), total, lower) if design == "adapters"
        else Phase("score", (*asleep, scored), total, "score with a smaller readability_model"),
    ]  # fmt: skip
    if tree:
        phases.append(Phase("tree", (*awake, scored), total, lower))
    for section in ("sft", "dpo"):
        train = getattr(config, section)
        if section == "dpo" and not tree:
            continue
        sides = 2 if section == "dpo" else 1
        tokens = train.max_length * max(1, min(train.per_device_batch_size, train.batch_size))
        state = _trainable_gb(shape, train, world, zero_stage, dtype_bytes)
        parts = (*asleep, ("weights", _weights_gb(shape, train, world, zero_stage, dtype_bytes)), *state)
        if section == "dpo" and not train.lora and not train.precompute_ref_log_probs:
            parts += (("reference", weights / (world if zero_stage == 3 else 1)),)
        parts += (("activations", sides * _activations_gb(shape, tokens, train.gradient_checkpointing)),
                  ("logits", sides * tokens * shape.vocab * LOGIT_BYTES / GB))  # fmt: skip
        fix = ("lower the batch or max_length, turn on gradient checkpointing, or train with LoRA"
               if train.lora else "train with LoRA (--profile paper) or shard with ZeRO-3 over more GPUs "
               "(accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml)")  # fmt: skip
        phases.append(Phase(section, parts, total, fix))
    return MemoryPlan(total_gb=total, world=world, utilization=util, max_utilization=max_util,
                      phases=tuple(phases), weights=design)  # fmt: skip


def plan_run(config: Any, total_bytes: float | None = None) -> tuple[Any, MemoryPlan | None]:
    """The plan of a vLLM run on GPUs of ``total_bytes`` (``None``: this process's GPU, when torch
    sees one), with ``config`` fitted (:meth:`MemoryPlan.fitted`); ``(config, None)`` for another
    backend, without a GPU to plan for, or when the model's config cannot be read."""
    if config.generation.backend != "vllm":
        return config, None
    if total_bytes is None:
        from optima_trainers.config.train import cuda_available

        if not cuda_available():
            return config, None
        import torch

        total_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    from optima_env.models import read_model_config

    model = read_model_config(config.model)
    if model is None:
        return config, None
    scorer = read_model_config(config.readability_model) if config.readability_model else model
    shape, scorer_shape = ModelShape.from_config(model), ModelShape.from_config(scorer or model)
    fitted = plan_memory(config, shape, total_bytes, scorer_shape=scorer_shape).fitted(config)
    return fitted, plan_memory(fitted, shape, total_bytes, scorer_shape=scorer_shape)


def _scoring_batch_gb(shape: ModelShape, dtype_bytes: int, batch_tokens: int = 2048) -> float:
    """The scorer's working set: one batch's hidden states and one LM-head chunk of 2^26 // vocab
    positions (:class:`optima_env.readability.TransformersLMLoss`'s defaults)."""
    chunk = 2**26 // shape.vocab
    return (batch_tokens * shape.hidden * dtype_bytes + chunk * shape.vocab * LOGIT_BYTES) / GB


def _weights_gb(shape: ModelShape, train: Any, world: int, zero_stage: int | None, dtype_bytes: int) -> float:
    shards = world if (zero_stage == 3 and not train.lora) else 1
    return shape.params * dtype_bytes / GB / shards


def _trainable_gb(shape: ModelShape, train: Any, world: int, zero: int | None, dtype_bytes: int) -> tuple:
    if train.lora:
        return (("LoRA state", shape.lora_params(train.lora_r) * LORA_BYTES / GB),)
    shards = world if zero in (2, 3) else 1
    return (("gradients and Adam", shape.params * FULL_STATE_BYTES / GB / shards),)


def _activations_gb(shape: ModelShape, tokens: int, checkpointing: bool | None) -> float:
    per_layer = tokens * shape.activation_values * 2
    if checkpointing:
        return (tokens * shape.hidden * 2 * shape.layers + per_layer) / GB
    return per_layer * shape.layers / GB
