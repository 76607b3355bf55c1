"""The vLLM engine as *base + adapters*: the engine holds the base model, each stage's policy is a
LoRA adapter added at run time, and readability is the base's own ``prompt_logprobs``.

:class:`VLLMAdapters` is the part of :class:`~optima_env.backends.vllm.VLLMPolicy` that does it,
on an engine started with :func:`lora_engine_options` (``enable_lora``, two adapter slots, the
blocks' linear layers as targets: with vLLM's default targets the LM head is wrapped too, and
``prompt_logprobs`` then kills vLLM 0.32's engine). :meth:`VLLMAdapters.use_adapter` makes every
later request (``generate``, ``submit``) carry one adapter folder's ``LoRARequest``, or none for
the base; vLLM's prefix cache keys its blocks by the adapter's name and path, so no cache reset is
needed when it changes. :class:`EngineLMLoss` scores turns as
:class:`~optima_env.readability.TransformersLMLoss` does (the same tokens,
:func:`~optima_env.readability.encode_turns`), from ``prompt_logprobs`` of the base: through a
*zero adapter* (the active adapter's modules with every ``lora_B`` = 0, written once) while an
adapter is active, because vLLM-CPU's LoRA ops give a row without an adapter whichever adapter
sits in the last slot, so base rows batched with adapter rows came out wrong; GPUs skip such rows,
and the zero adapter is right on both. The measurement behind the design is
``docs/guides/gpus.md`` "One engine: base + adapters, or weights in place".
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from optima_env.errors import BackendError, ConfigError, require

__all__ = [
    "LORA_RANKS",
    "LORA_TARGET_MODULES",
    "MAX_LORAS",
    "EngineLMLoss",
    "VLLMAdapters",
    "lora_engine_options",
    "lora_slot_rank",
]

LORA_TARGET_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
"""The engine's ``lora_target_modules``: the blocks' linear layers under vLLM's packed names, what
the trainer's ``all-linear`` adapters adapt (the LM head stays unwrapped)."""
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM 0.32 accepts."""
MAX_LORAS = 2
"""Adapter slots of one batch: the stage's adapter and the zero adapter."""
_ZERO_ID = 1
"""The zero adapter's ``lora_int_id``; the stages' adapters are numbered from 2."""


def lora_slot_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of ``rank``.

    >>> lora_slot_rank(16), lora_slot_rank(112), lora_slot_rank(300)
    (16, 128, 320)
    """
    for slot in LORA_RANKS:
        if rank <= slot:
            return slot
    raise ConfigError(
        f"the run's stacked adapters reach rank {rank}, above the {LORA_RANKS[-1]} vLLM's LoRA slots "
        "take: set generation.vllm_weights=in_place, or train fewer stages or with a lower lora_r"
    )


def lora_engine_options(max_lora_rank: int) -> dict[str, Any]:
    """``vllm.LLM``'s keyword arguments of a base + adapters engine whose adapters reach
    ``max_lora_rank`` (rounded up to a rank vLLM accepts, :func:`lora_slot_rank`)."""
    return {
        "enable_lora": True,
        "max_loras": MAX_LORAS,
        "max_lora_rank": lora_slot_rank(max_lora_rank),
        "lora_target_modules": list(LORA_TARGET_MODULES),
    }


class VLLMAdapters:
    """``use_adapter`` and the engine's readability scorer, mixed into
    :class:`~optima_env.backends.vllm.VLLMPolicy` (which provides ``llm``, ``tokenizer``, sleep
    state and :meth:`~optima_env.backends.vllm_turns.VLLMTurns._run_beside`)."""

    llm: Any
    tokenizer: Any
    _asleep: bool

    def _init_adapters(self) -> None:
        self._adapter: Any = None  # the active LoRARequest (None: the base)
        self._adapter_ids: dict[str, int] = {}
        self._zero: Any = None
        self._zero_dir: str | None = None

    @property
    def lora_enabled(self) -> bool:
        """Whether the engine was started with LoRA (:func:`lora_engine_options`)."""
        config = getattr(getattr(self.llm, "llm_engine", None), "vllm_config", None)
        return getattr(config, "lora_config", None) is not None

    @property
    def adapter(self) -> str | None:
        """The adapter folder every request carries now (``None``: the base model)."""
        return None if self._adapter is None else self._adapter.lora_path

    def use_adapter(self, folder: str | None) -> None:
        """Generate with the LoRA adapter in ``folder`` from now on (``None``: the base model).
        Each folder keeps its own adapter id for the engine's life and is added to the engine when
        it becomes active (the one before it removed); turns still pending
        are aborted first (:meth:`~optima_env.backends.vllm_turns.VLLMTurns._drop_pending`)."""
        if folder is None:
            if self._adapter is not None:
                self._drop_pending("change the adapter")  # type: ignore[attr-defined]
            self._adapter = None
            return
        if not self.lora_enabled:
            raise BackendError(
                "this vLLM engine was started without LoRA: start it with lora_engine_options() "
                "(optima_env.backends.vllm_lora) to generate with adapters"
            )
        from vllm.lora.request import LoRARequest

        path = str(Path(folder).resolve())
        if self._adapter is not None and self._adapter.lora_path == path:
            return
        self._drop_pending("change the adapter")  # type: ignore[attr-defined]
        lora_id = self._adapter_ids.setdefault(path, len(self._adapter_ids) + _ZERO_ID + 1)
        request = LoRARequest(f"optima-adapter-{lora_id}", lora_id, path)
        try:
            self.llm.llm_engine.add_lora(request)
        except Exception as exc:
            raise BackendError(
                f"vLLM could not load the LoRA adapter {path} ({type(exc).__name__}: {exc}); its "
                "rank must fit the engine's max_lora_rank and its modules the engine's targets"
            ) from exc
        if self._adapter is not None:  # the last stage's adapter leaves the engine's cache
            self.llm.llm_engine.remove_lora(self._adapter.lora_int_id)
        self._adapter = request

    def _lora_request(self) -> Any:
        """The ``LoRARequest`` of every generated turn (``None``: the base)."""
        return self._adapter

    def _base_request(self) -> Any:
        """The ``LoRARequest`` of rows that must see the base: none without an active adapter, else
        the zero adapter (written once, from the active adapter's modules)."""
        if self._adapter is None:
            return None
        if self._zero is None:
            from vllm.lora.request import LoRARequest

            self._zero_dir = tempfile.mkdtemp(prefix="optima-zero-lora-")
            _write_zero_adapter(Path(self._adapter.lora_path), Path(self._zero_dir))
            self._zero = LoRARequest("optima-zero", _ZERO_ID, self._zero_dir)
        return self._zero

    def readability_scorer(self, *, max_length: int = 2048, system: str = "none") -> EngineLMLoss:
        """Readability from this engine's base model (:class:`EngineLMLoss`)."""
        return EngineLMLoss(self, max_length=max_length, system=system)

    @contextlib.contextmanager
    def _awake(self) -> Iterator[None]:
        """The engine awake while scoring: woken (weights and KV cache) if it sleeps, and put back
        to sleep after, so a training phase still finds the GPU free."""
        asleep = self._asleep
        if asleep:
            self.llm.wake_up()
            self._asleep = False
        try:
            yield
        finally:
            if asleep:
                self.llm.sleep(level=1)
                self._asleep = True

    def _close_adapters(self) -> None:
        if self._zero_dir is not None:
            shutil.rmtree(self._zero_dir, ignore_errors=True)
        self._init_adapters()


class EngineLMLoss:
    """Per-turn mean LM loss of the engine's *base* model, from vLLM's ``prompt_logprobs``: the
    same tokens as :class:`~optima_env.readability.TransformersLMLoss` (its template, truncation
    at ``max_length``; within ``1e-4`` nats of it on the tests' tiny model), without a second copy
    of the model. Runs beside pending turns (a tree stage scores leaves while the engine grows the
    tree) without aborting them, through the zero adapter while an adapter is active.

    Args:
        policy: a :class:`~optima_env.backends.vllm.VLLMPolicy` (with or without LoRA).
        max_length: longest scored sequence in tokens (the scorer's default 2048; also at most
            the engine's ``max_model_len`` - 1).
        system: as :class:`~optima_env.readability.TransformersLMLoss`'s.
    """

    def __init__(self, policy: Any, *, max_length: int = 2048, system: str = "none") -> None:
        from optima_env.readability import turn_template

        self.policy = policy
        self.max_length = max_length
        self._template = turn_template(policy.tokenizer, system=system)

    def __call__(self, texts: Sequence[str]) -> list[float]:
        """The mean content-token loss of each text (same order)."""
        if not texts:
            return []
        vllm = require("vllm", "vllm")
        from vllm.inputs import TokensPrompt

        from optima_env.readability import encode_turns

        policy = self.policy
        limit = min(self.max_length, policy.max_model_len - 1)  # the prompt and one sampled token
        turns = encode_turns(policy.tokenizer, texts, self._template, max_length=limit)
        params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in turns]
        with policy._awake():
            outputs = policy._run_beside(prompts, params, policy._base_request())
        return [
            -sum(out.prompt_logprobs[j][ids[j]].logprob for j in scored) / len(scored)
            for (ids, scored), out in zip(turns, outputs)
        ]


def _write_zero_adapter(source: Path, out: Path) -> None:
    """``source``'s adapter with every ``lora_B`` zero into ``out``: the base model as an adapter
    (the same modules and rank, so it shares a batch with ``source``'s rows)."""
    safetensors_torch = require("safetensors.torch", "train")
    from optima_env.backends.peft_adapter import ADAPTER_WEIGHTS

    weights = safetensors_torch.load_file(str(source / ADAPTER_WEIGHTS))
    zero = {k: (v.zero_() if ".lora_B." in k else v) for k, v in weights.items()}
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "adapter_config.json").read_text(encoding="utf-8"))
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
    safetensors_torch.save_file(zero, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
