"""Hugging Face transformers backend: batched chat generation on CPU or GPU.

Prompts are rendered with the tokenizer's chat template, the forced reply prefix (``"Alice:"``) is
appended after the generation prompt, prompts are sorted by length and generated in left-padded
batches, and the continuation is returned after the prefix. With ``SamplingParams.seed`` set, the
sampling of a batch is seeded from that seed and the requests' keys, so the same batch gives the
same text.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from optima_env.errors import BackendError, require
from optima_env.policy import GenerationRequest, SamplingParams

__all__ = ["TransformersPolicy", "render_prompt"]


def render_prompt(tokenizer: Any, request: GenerationRequest) -> str:
    """The chat-formatted prompt text, ending with the forced reply prefix."""
    try:
        text = tokenizer.apply_chat_template(
            list(request.messages), tokenize=False, add_generation_prompt=True
        )
    except Exception as exc:  # tokenizers raise ValueError/TemplateError variously
        raise BackendError(
            f"the tokenizer could not apply its chat template ({exc}); use a chat model or set "
            "tokenizer.chat_template"
        ) from exc
    return text + request.prefix


class TransformersPolicy:
    """A :class:`~optima_env.policy.ChatPolicy` over a transformers causal LM.

    Args:
        model: a ``PreTrainedModel`` (eval mode).
        tokenizer: its tokenizer (padding side is forced to ``left``).
        batch_size: prompts per ``generate`` call.
    """

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int = 32) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.batch_size = batch_size

    @classmethod
    def from_pretrained(cls, name_or_path: str = "embedded", **kwargs: Any) -> TransformersPolicy:
        """Load a model with :func:`optima_env.models.load_model` and wrap it."""
        from optima_env.models import load_model

        batch_size = kwargs.pop("batch_size", 32)
        model, tokenizer = load_model(name_or_path, **kwargs)
        return cls(model, tokenizer, batch_size=batch_size)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        torch = require("torch", "train")
        prompts = [render_prompt(self.tokenizer, r) for r in requests]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[str] = [""] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            if sampling.seed is not None:
                keys = repr([requests[i].key for i in chunk]).encode()
                torch.manual_seed((sampling.seed * 1_000_003 + zlib.crc32(keys)) % (2**31))
            texts = self._generate_batch([prompts[i] for i in chunk], sampling)
            for i, text in zip(chunk, texts):
                out[i] = requests[i].prefix + text
        return out

    def _generate_batch(self, prompts: list[str], sampling: SamplingParams) -> list[str]:
        torch = require("torch", "train")
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        if sampling.temperature > 0:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.inference_mode():
            generated = self.model.generate(**enc, **kwargs)
        new_tokens = generated[:, enc["input_ids"].shape[1] :]
        return self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
