"""The ``generation`` section of the trainer configuration (:mod:`optima_trainers.config.train`),
and what it decides with the training sections (LoRA ranks, how vLLM holds the weights).

A leaf module, so that the tree code (:mod:`optima_trainers.tree.nodes`,
:mod:`optima_trainers.tree.search`) takes the section as it is without importing the rest of
the configuration; like the other sections (``TreeSearchConfig`` in
:mod:`optima_trainers.config.tree`, ``SFTTrainConfig`` and ``DPOTrainConfig`` in
:mod:`optima_trainers.config.training`), each setting is declared here once and reached through
:class:`~optima_trainers.config.train.TrainConfig` by its dotted name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from optima_env.configtree import check_number, check_positive_int
from optima_env.errors import ConfigError

__all__ = ["VLLM_WEIGHTS", "GenerationConfig", "lora_stage_rank", "resolve_vllm_weights"]

VLLM_WEIGHTS = ("auto", "in_place", "adapters")
"""The values of :attr:`GenerationConfig.vllm_weights`."""
_LORA_SECTIONS = {"isft": ("sft",), "idpo": ("sft", "dpo"), "isft-dpo": ("sft", "dpo")}
"""The training sections each built-in trainer's stages train with."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationConfig:
    """How the host samples conversations (every stage; the tree search takes its caps from here)."""

    instances: int = 8
    """Training instances per sampled stage (``sample_count``); the cursor continues and wraps."""
    num_samples: int = 4
    """Conversations sampled per instance (N, ``explore_count``)."""
    max_turns: int = 10
    """Turns per conversation (and the tree search's depth)."""
    max_new_tokens: int = 256
    """Generation cap of one turn in tokens."""
    temperature: float = 0.7
    """Sampling temperature after the initialization (and of the tree search)."""
    init_temperature: float = 0.3
    """Sampling temperature of the initialization (0.3 IE/ARC/MMLU, 0.7 GSM8K/MATH; spec §4)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    diverse_init: bool = True
    """The initialization samples with the format-diverse prompt pool (when the task has one)."""
    backend: Literal["hf", "vllm", "openai"] = "hf"
    """Generation backend: transformers, vLLM, or ``openai``: OpenAI-compatible vLLM servers at
    :attr:`base_urls` (README "Generating on vLLM servers")."""
    base_urls: tuple[str, ...] = ()
    """``backend="openai"``: the servers' base URLs, one per replica (e.g.
    ``http://10.0.0.1:8000/v1,http://10.0.0.2:8000/v1``); each conversation stays on one of them
    and moves only when its server fails. Every server serves the run's starting model."""
    served_model: str | None = None
    """``backend="openai"``: the name the servers serve the starting model under (vLLM's
    ``--served-model-name``); ``None``: the one base model their ``/v1/models`` lists."""
    server_weights: Literal["lora", "hook"] = "lora"
    """``backend="openai"``: how a stage's trained weights reach the servers. ``lora``: the
    checkpoint's difference from the starting model is written as a LoRA adapter next to it (the
    stages' own adapters stacked, exact, at the sum of their ranks; else an SVD at
    :attr:`server_lora_rank`: :func:`optima_trainers.generation.servers.server_adapter`) and
    loaded at run time (vLLM's ``/v1/load_lora_adapter``; servers started with ``--enable-lora``
    and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, reading the run folder at the same path);
    ``hook``: a plugin's ``optima_deliver_weights`` (full fine-tuning: vLLM cannot swap a
    server's full weights at run time)."""
    server_lora_rank: int = 16
    """``server_weights="lora"``, for a checkpoint without stage adapters to stack (full
    fine-tuning somewhere in its chain): rank of the SVD-exported adapter, the best approximation
    of that rank (its error is logged). The servers need ``--max-lora-rank`` >= it (and >= the sum
    of the stacked stages' ranks)."""
    concurrency: int | None = None
    """Conversations in flight in every rollout of the run (sampled stages, normalizer
    conversations, tree searches). ``None`` (the default): sized from the engine's ``capacity``
    (:func:`optima_env.rollout.rollout`): the transformers engine's :attr:`batch_size`, vLLM's
    ``max_num_seqs`` (:attr:`vllm_max_num_seqs`); for the servers (``backend="openai"``) 128 per
    server URL (:data:`optima_trainers.generation.servers.SERVER_CONVERSATIONS`), which is also
    the client's requests in flight; a value below that is warned about (the servers idle)."""
    batch_size: int = 32
    """The engine's batch slots: requests the transformers engine decodes at once (its continuous
    batching admits a new turn into each slot that frees). vLLM sizes its own batch
    (:attr:`vllm_max_num_seqs`); the servers batch on their own."""
    driver: Literal["auto", "batch", "turns"] = "auto"
    """How rollouts drive the engine (:data:`optima_env.turns.DRIVERS`): ``turns``: each
    conversation's next turn is submitted the moment its last one returns (the engine's own
    :class:`~optima_env.policy.TurnEngine`: vLLM's engine, the transformers engine's continuous
    batching, the servers' client); ``batch``: one ``generate`` per step over every running
    conversation's turn, waiting for its longest reply (the driver before turn engines existed);
    ``auto`` (the default): ``turns`` when the engine implements it, else ``batch``."""
    vllm_tensor_parallel_size: int = 1
    """``backend="vllm"``: GPUs one engine shards the model over (vLLM's ``tensor_parallel_size``)."""
    vllm_data_parallel_size: int = 1
    """``backend="vllm"``: engine replicas (``data_parallel_size``); vLLM's offline engine takes 1
    only (one rank per process), so more is refused with what to do instead (README "Scaling out")."""
    vllm_max_num_seqs: int | None = None
    """``backend="vllm"``: requests the engine decodes at once (vLLM's ``max_num_seqs``, its
    ``capacity``, so also the conversations in flight when :attr:`concurrency` is ``None``);
    ``None``: vLLM's own default."""
    vllm_gpu_memory_utilization: float = 0.9
    """``backend="vllm"``: share of each GPU's memory vLLM may take (on CPUs: of host memory)."""
    hf_kv_cache_mb: float | None = None
    """``backend="hf"``: memory (MiB) for the KV states of the transformers engine's running batch
    (:class:`~optima_env.backends.hf.TransformersPolicy`'s ``kv_cache_mb``; a turn waits for a
    slot while the running ones, run to their ``max_new_tokens``, would not fit); ``None``: the
    engine's default."""
    precision: Literal["auto", "float32", "bfloat16"] = "auto"
    """``backend="hf"``: the precision an fp32 model decodes in on CPU
    (:mod:`optima_env.backends.precision`): ``auto`` runs the linear layers in bf16 where the CPU
    has native bf16 (AVX512_BF16, AMX) and fp32 elsewhere; ``float32`` or ``bfloat16`` force one.
    Rollouts, trees and baselines use it; training keeps :attr:`TrainConfig.dtype`. Each stage
    folder records the engine that generated it (``engine.json``) and refuses to resume under another."""
    sampler: Literal["cdf", "multinomial"] = "cdf"
    """``backend="hf"``: how the transformers engine samples (:data:`optima_env.backends._tokens.SAMPLERS`):
    ``cdf`` (exact inverse-CDF sampling, one uniform draw per row) or ``multinomial`` (per-row
    ``torch.multinomial``: the same distribution, another random stream; replays stages generated
    before ``cdf``)."""
    vllm_reuse_engine: bool = True
    """``backend="vllm"``: one engine serves the run; each stage's weights are loaded into it in
    place (0.6 s on vLLM-CPU where a new engine takes 19-115 s to start) and, on GPUs, it sleeps
    while a stage trains (:mod:`optima_trainers.generation.engines`). ``False``: a new engine per stage."""
    vllm_weights: Literal["auto", "in_place", "adapters"] = "auto"
    """``backend="vllm"`` with one engine per run: how each stage's policy reaches the engine
    (``docs/guides/gpus.md`` "One engine: base + adapters, or weights in place"). ``in_place``: the
    engine holds the stage's merged weights, reloaded at each stage (vLLM's ``reload_weights``),
    and a separate frozen model scores readability. ``adapters``: the engine holds the starting
    model and each stage's policy is its stages' LoRA adapters stacked exactly (the adapter the
    servers get, :func:`~optima_trainers.generation.servers.server_adapter`), added at run time;
    readability is the engine's own ``prompt_logprobs`` of the base
    (:class:`~optima_env.backends.vllm_lora.EngineLMLoss`), so no second copy of the model is
    loaded. Needs LoRA training (``sft.lora``/``dpo.lora``) and :attr:`vllm_reuse_engine`.
    ``auto`` (the default): ``adapters`` on a CUDA GPU when both hold, else ``in_place`` (on
    vLLM-CPU LoRA rows decode several times slower than merged weights).
    :func:`resolve_vllm_weights` decides."""
    max_model_len: int | None = None
    """The longest prompt plus reply the model takes, in tokens (``None``: the context the model's
    config declares, a local folder or a hub id, and with vLLM the running engine's own
    ``max_model_len``, which vLLM takes from the same config). A conversation whose next prompt
    would leave less than ``max_new_tokens`` of it ends there, truncated with
    ``end_reason="context_full"``, as at the turn cap (never a failed batch); the vLLM engine is
    built with this length."""
    stop_at_speaker_tags: bool = False
    """Cut a turn where it starts writing an agent's ``"Name:"`` tag. The reference code does not
    (it penalizes impersonation afterwards); the cpu profile does, because a 135M model speaks for
    its partner in most turns, and the -10 penalty would leave nothing to select."""
    message_format: Literal["code", "alternating"] = "code"
    """Roles of the turns in prompts and training examples (``code``: all ``assistant``)."""
    termination: Literal["repeat", "all_agents"] = "repeat"
    """When a conversation ends by agreement (spec §13 item 12): the same answer twice in a row
    among answer-bearing turns (``repeat``, the reference) or every agent's latest answer the
    same (``all_agents``, the paper)."""
    agent_models: Mapping[str, str] = field(default_factory=dict)
    """Roles that speak with a fixed model and do not train, e.g. ``{"Bob": "embedded"}`` (agent ->
    ``embedded``, a Hugging Face name, a folder or a checkpoint). The other roles speak with the
    model being trained, and only their turns train (SFT examples, DPO pairs)."""

    def __post_init__(self) -> None:
        for name in ("instances", "num_samples", "max_turns", "max_new_tokens", "batch_size"):
            check_positive_int(f"generation.{name}", getattr(self, name))
        for name in ("concurrency", "vllm_max_num_seqs"):
            if getattr(self, name) is not None:
                check_positive_int(f"generation.{name}", getattr(self, name))
        check_driver(self.driver)
        if self.vllm_weights not in VLLM_WEIGHTS:
            raise ConfigError(
                f"generation.vllm_weights must be one of {', '.join(VLLM_WEIGHTS)}, got {self.vllm_weights!r}"
            )
        for name in ("temperature", "init_temperature"):
            check_number(f"generation.{name}", getattr(self, name), low=0.0)
        check_number("generation.top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        if self.max_model_len is not None:
            check_positive_int("generation.max_model_len", self.max_model_len)
        for name in ("vllm_tensor_parallel_size", "vllm_data_parallel_size", "server_lora_rank"):
            check_positive_int(f"generation.{name}", getattr(self, name))
        check_base_urls(self.backend, self.base_urls)
        if self.backend == "openai" and self.agent_models:
            raise ConfigError(
                "generation.agent_models is not supported with generation.backend=openai (the servers serve "
                f"one trained model per stage), got {dict(self.agent_models)}; use --backend hf or vllm "
                "for fixed roles"
            )
        if self.hf_kv_cache_mb is not None:
            check_number("generation.hf_kv_cache_mb", self.hf_kv_cache_mb, low=0.0, low_open=True)
        check_precision(self.precision)
        check_number(
            "generation.vllm_gpu_memory_utilization",
            self.vllm_gpu_memory_utilization,
            low=0.0,
            high=1.0,
            low_open=True,
        )

    def stops(self, agents: Sequence[str]) -> tuple[str, ...]:
        """Stop strings of every generated turn, sampled or tree (the agents' ``"Name:"`` tags when
        :attr:`stop_at_speaker_tags`, else none)."""
        from optima_env.policy import speaker_stops

        return speaker_stops(agents) if self.stop_at_speaker_tags else ()

    def sampling(self, agents: Sequence[str], *, seed: int | None, init: bool = False) -> Any:
        """The :class:`~optima_env.policy.SamplingParams` of every generated turn of the run
        (sampled stages, tree searches, GRPO rollouts): :attr:`init_temperature` for the
        initialization's samples (``init``), else :attr:`temperature`; :attr:`top_p`,
        :attr:`max_new_tokens`, :meth:`stops`; ``seed`` the stage's (requests derive their own)."""
        from optima_env.policy import SamplingParams

        return SamplingParams(
            temperature=self.init_temperature if init else self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            seed=seed,
            stop=self.stops(agents),
        )

    def policy_options(self) -> dict[str, Any]:
        """The backend's own keyword arguments for :func:`optima_env.backends.loading.load_policy`
        (``vllm``: its scale switches; ``hf``: :attr:`precision`, :attr:`sampler` and
        :attr:`hf_kv_cache_mb` where set)."""
        if self.backend == "hf":
            kv = {} if self.hf_kv_cache_mb is None else {"kv_cache_mb": self.hf_kv_cache_mb}
            return {"precision": self.precision, "sampler": self.sampler, **kv}
        if self.backend != "vllm":
            return {}
        options: dict[str, Any] = {
            "tensor_parallel_size": self.vllm_tensor_parallel_size,
            "data_parallel_size": self.vllm_data_parallel_size,
            "gpu_memory_utilization": self.vllm_gpu_memory_utilization,
        }
        if self.vllm_max_num_seqs is not None:
            options["max_num_seqs"] = self.vllm_max_num_seqs
        if self.max_model_len is not None:  # else the engine takes the model's own context length
            options["max_model_len"] = self.max_model_len
        return options


def check_precision(precision: object) -> None:
    """``generation.precision``: one of :data:`optima_env.backends.precision.PRECISIONS`."""
    from optima_env.backends.precision import PRECISIONS

    if precision not in PRECISIONS:
        raise ConfigError(
            f"generation.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}; e.g. "
            "--set generation.precision=float32 (fp32 decode) or generation.precision=auto"
        )


def check_driver(driver: object) -> None:
    """``generation.driver``: one of :data:`optima_env.turns.DRIVERS`."""
    from optima_env.turns import DRIVERS

    if driver not in DRIVERS:
        raise ConfigError(
            f"generation.driver must be one of {', '.join(DRIVERS)}, got {driver!r}; e.g. "
            "--set generation.driver=turns (each conversation advances on its own) or "
            "generation.driver=batch (one generate call per step)"
        )


def check_base_urls(backend: str, urls: Sequence[str]) -> None:
    """``generation.base_urls``: required (and only meaningful) with ``backend="openai"``; each an
    ``http(s)://HOST:PORT/v1`` URL, none twice."""
    example = "--set generation.base_urls=http://10.0.0.1:8000/v1,http://10.0.0.2:8000/v1"
    if backend != "openai":
        if urls:
            raise ConfigError(
                f"generation.base_urls is for generation.backend=openai (vLLM servers), but the backend is "
                f"{backend!r}; set --backend openai, or drop generation.base_urls"
            )
        return
    if not urls:
        raise ConfigError(
            "generation.backend=openai needs the servers' base URLs in generation.base_urls, got none; "
            f"e.g. {example}"
        )
    for url in urls:
        if (
            not isinstance(url, str)
            or not url.startswith(("http://", "https://"))
            or not url.rstrip("/").endswith("/v1")
        ):
            raise ConfigError(
                "generation.base_urls: expected http(s) URLs ending in /v1 (an OpenAI-compatible "
                "server's base), "
                f"got {url!r}; e.g. {example}"
            )
    duplicates = sorted({u for u in urls if list(urls).count(u) > 1})
    if duplicates:
        raise ConfigError(f"generation.base_urls lists {duplicates} more than once; list each server once")


def lora_stage_rank(config: Any) -> int | None:
    """The rank of the last stage's stacked adapters, the sum of every training stage's
    ``lora_r`` (an upper bound: a stage trained from the base starts a new stack); ``None`` when
    the run's stages do not all train LoRA adapters (full fine-tuning, or a trainer other than the
    built-in ``isft``, ``idpo`` and ``isft-dpo``)."""
    sections = _LORA_SECTIONS.get(config.trainer)
    if sections is None or not all(getattr(config, name).lora for name in sections):
        return None
    n = config.iterations
    stages = {"isft": {"sft": n}, "idpo": {"sft": 1, "dpo": n}, "isft-dpo": {"sft": n, "dpo": n}}
    return sum(count * getattr(config, name).lora_r for name, count in stages[config.trainer].items())


def resolve_vllm_weights(config: Any, *, cuda: bool) -> Literal["in_place", "adapters"]:
    """What :attr:`GenerationConfig.vllm_weights` means for the run ``config`` (a
    :class:`~optima_trainers.config.train.TrainConfig`): ``auto`` is ``adapters`` when ``cuda``,
    the run trains LoRA adapters (:func:`lora_stage_rank`) and reuses one vLLM engine, else
    ``in_place``; another backend is ``in_place`` (nothing to choose).

    Raises:
        ConfigError: ``adapters`` where no adapter exists (full fine-tuning, a plugin's trainer),
            without one engine per run, or with fixed roles' models.
    """
    gen = config.generation
    if gen.backend != "vllm" or gen.vllm_weights == "in_place":
        return "in_place"
    rank = lora_stage_rank(config)
    shared = gen.vllm_reuse_engine and not gen.agent_models
    if gen.vllm_weights == "auto":
        return "adapters" if cuda and rank is not None and shared else "in_place"
    if rank is None:
        raise ConfigError(
            f"generation.vllm_weights=adapters needs every stage to train a LoRA adapter, but trainer "
            f"{config.trainer!r} with sft.lora={config.sft.lora}, dpo.lora={config.dpo.lora} leaves no "
            "adapter to generate with (full fine-tuning: --profile paper-full): set "
            "generation.vllm_weights=in_place (or auto)"
        )
    if not shared:
        raise ConfigError(
            "generation.vllm_weights=adapters needs one engine for the run: set "
            "generation.vllm_reuse_engine=true and no generation.agent_models, or "
            "generation.vllm_weights=in_place (or auto)"
        )
    return "adapters"
