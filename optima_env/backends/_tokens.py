"""Per-token helpers of the transformers backend, shared by its batch loop
(:meth:`~optima_env.backends.hf.TransformersPolicy.generate`) and its continuous batching
(:class:`~optima_env.backends.hf_stream.StreamingDecoder`): sampling one token per row, the stop
strings, and the tokens whose KV states a finished row holds. torch is imported lazily.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optima_env.policy import SamplingParams

__all__ = ["cached_ids", "has_stop", "sample_next"]


def cached_ids(prompt: np.ndarray, generated: list[int]) -> np.ndarray:
    """The tokens whose KV states a row holds: the prompt and every generated token but the last."""
    return np.concatenate([prompt, np.asarray(generated[:-1], dtype=np.int64)])


def sample_next(logits: Any, sampling: SamplingParams, generators: list | None, suppress: list[int] | None):
    """Next token per row: greedy, or temperature / top-p sampling with per-row generators."""
    import torch

    if suppress:
        logits[:, suppress] = float("-inf")
    if sampling.greedy:
        return logits.argmax(-1)
    logits = logits / sampling.temperature
    if sampling.top_p < 1.0:
        sorted_logits, index = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > sampling.top_p
        sorted_logits[drop] = float("-inf")
        logits = torch.full_like(logits, float("-inf")).scatter_(1, index, sorted_logits)
    probs = logits.softmax(-1)
    if generators is None:
        return torch.multinomial(probs, 1).squeeze(1)
    return torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)])


def has_stop(tokenizer: Any, tail: list[int], stop: tuple[str, ...]) -> bool:
    """Whether the decoded ``tail`` tokens contain a stop string."""
    text = tokenizer.decode(tail, skip_special_tokens=True)
    return any(s in text for s in stop)
