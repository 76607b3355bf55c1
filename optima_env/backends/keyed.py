"""Per-request sampling for models outside the transformers backend's fast path.

Exact resume needs every reply to depend on its request alone, not on the batch it lands in: a
resumed run batches the remaining conversations differently from an uninterrupted one. The
transformers backend's fast decode loop (Llama-like models) already seeds each request on its own
(:func:`optima_env.policy.request_seed`); its ``model.generate`` path, used for other
architectures, seeds a batch as a whole. :class:`KeyedSamplingPolicy` closes that gap: on the
``generate`` path each new token is drawn with the Gumbel-max trick from a generator seeded by
``(request seed, position)``::

    token = argmax(log softmax(logits / T) restricted to the top-p nucleus + Gumbel noise)

which is an exact sample from the tempered nucleus distribution, with no randomness shared
between rows (the same request gives the same reply in any batch, up to float rounding of the
padded batch, which moves a Gumbel argmax only on a near-exact tie).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optima_env.backends.hf import TransformersPolicy, render_prompt
from optima_env.errors import require
from optima_env.policy import GenerationRequest, SamplingParams, finish_reply, request_seed

__all__ = ["KeyedSamplingPolicy"]


class _GumbelProcessor:
    """A logits processor that turns greedy decoding into keyed sampling (see module docstring)."""

    def __init__(self, seeds: Sequence[int], prompt_length: int, temperature: float, top_p: float) -> None:
        self.seeds = list(seeds)
        self.prompt_length = prompt_length
        self.temperature = temperature
        self.top_p = top_p

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        torch = require("torch", "train")
        step = input_ids.shape[1] - self.prompt_length
        logits = scores.float() / self.temperature
        if self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
            probs = sorted_logits.softmax(dim=-1)
            remove = probs.cumsum(dim=-1) - probs >= self.top_p  # keep the first token past p
            sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
        noise = torch.empty(logits.shape, dtype=torch.float32)
        generator = torch.Generator(device="cpu")
        for row, seed in enumerate(self.seeds):
            generator.manual_seed((seed * 1_000_003 + step) % (2**63 - 1))
            uniform = torch.rand(logits.shape[-1], generator=generator, dtype=torch.float64)
            noise[row] = (-torch.log(-torch.log(uniform.clamp_(1e-12, 1 - 1e-12)))).float()
        return logits.log_softmax(dim=-1) + noise.to(logits.device)


class KeyedSamplingPolicy(TransformersPolicy):
    """:class:`~optima_env.backends.hf.TransformersPolicy` whose ``model.generate`` path samples
    each request from its own seed (:func:`~optima_env.policy.request_seed`).

    Greedy or unseeded requests behave exactly as in the parent class.
    """

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int = 32) -> None:
        super().__init__(model, tokenizer, batch_size=batch_size, fast=False)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        if sampling.temperature == 0 or sampling.seed is None:
            return super().generate(requests, sampling)
        prompts = [render_prompt(self.tokenizer, r) for r in requests]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[str] = [""] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            seeds = [request_seed(sampling.seed, requests[i].key) for i in chunk]
            texts = self._keyed_batch([prompts[i] for i in chunk], seeds, sampling)
            for i, text in zip(chunk, texts):
                out[i] = finish_reply(requests[i].prefix, text, sampling.stop)
        return out

    def _keyed_batch(self, prompts: list[str], seeds: list[int], sampling: SamplingParams) -> list[str]:
        torch = require("torch", "train")
        transformers = require("transformers", "train")
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        processor = _GumbelProcessor(seeds, enc["input_ids"].shape[1], sampling.temperature, sampling.top_p)
        with torch.inference_mode():
            generated = self.model.generate(
                **enc,
                max_new_tokens=sampling.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.eos_ids,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                logits_processor=transformers.LogitsProcessorList([processor]),
            )
        new_tokens = generated[:, enc["input_ids"].shape[1] :]
        return self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
