"""Hugging Face transformers backend: batched chat generation on CPU or GPU, fp32 or bf16.

Prompts are rendered with the tokenizer's chat template and the forced reply prefix
(``"Alice:"``) is appended after the generation prompt; the continuation is returned after the
prefix. Prompts are sorted by length and generated in batches of ``batch_size``.

Two decoding paths:

* **fast** (default for Llama-like models, :func:`~optima_env.backends._kv.fast_path_supported`):
  a decode loop of its own over a preallocated KV buffer with grouped-query attention, which
  prefills only what is new since the longest cached prefix (:class:`~optima_env.backends._kv.PrefixCache`:
  a conversation's earlier turns and the system prompt that samples of one instance share), drops
  finished rows from the batch, and seeds each request on its own (:func:`~optima_env.policy.request_seed`),
  so a seeded request samples the same text whatever else is in its batch (up to floating-point
  differences between batch shapes).
* **generate**: transformers' ``model.generate`` on left-padded batches (any model; the batch is
  seeded as a whole).

Both sample exactly by inverse CDF (:mod:`optima_env.backends._tokens`) and, for an fp32 model on
a CPU with native bf16, decode with the linear layers and the LM head in bf16, the KV cache in
fp32 (``precision="auto"``, :mod:`optima_env.backends.precision`: there, the same seed gives the
same text only in the same batch); :attr:`TransformersPolicy.engine` records both.

The policy is also a :class:`~optima_env.policy.TurnEngine` (``capacity``, ``submit``, ``poll``):
on the fast path :class:`~optima_env.backends.hf_stream.StreamingDecoder` runs one batch that
admits each submitted request into the next free slot (continuous batching); on the generate path
``poll`` answers what was submitted with :meth:`TransformersPolicy.generate`.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from optima_env.backends import _kv
from optima_env.backends._kv import decode_roofline, gqa_attention, kv_bytes_per_token, kv_geometry
from optima_env.backends._tokens import DecodeStats, cached_ids, check_sampler, has_stop, sample_next
from optima_env.backends.hf_stream import StreamingDecoder
from optima_env.backends.precision import Bf16Linears, check_precision, engine_record, resolve_precision
from optima_env.errors import BackendError, TaskContractError, require
from optima_env.policy import GenerationRequest, SamplingParams, finish_reply, request_seed

__all__ = [
    "DecodeStats",
    "TransformersPolicy",
    "decode_roofline",
    "gqa_attention",
    "kv_bytes_per_token",
    "kv_geometry",
    "render_prompt",
    "sample_next",
]

_NEG = _kv.NEG


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
        model: a ``PreTrainedModel`` (eval mode), on any device, fp32 or bf16.
        tokenizer: its tokenizer (padding side is forced to ``left``).
        batch_size: prompts per forward batch.
        fast: use the fast decode loop (``None``: when the model supports it); ``False`` uses
            ``model.generate``.
        prefix_cache_mb: memory for KV states kept across calls (fast path; 0 turns it off).
        kv_cache_mb: memory for the KV states of the running batch of ``submit``/``poll``
            (continuous batching): a queued request joins only while every running row, run to
            its ``max_new_tokens``, still fits. A request that alone needs more runs alone.
            While the buffer is reallocated the old one lives too, so the peak is up to twice this.
        precision: decode precision of an fp32 model on CPU (:mod:`optima_env.backends.precision`):
            ``auto`` (bf16 linear layers and LM head where the CPU has native bf16, else fp32;
            the KV cache stays in the model's dtype), ``float32`` (the same text for a seed in
            any batch) or ``bfloat16``; the resolved one is :attr:`precision`. The model's
            weights are not changed.
        sampler: ``cdf`` (exact inverse-CDF sampling, the default) or ``multinomial`` (replays
            episodes recorded before it; :data:`~optima_env.backends._tokens.SAMPLERS`).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int = 32,
        fast: bool | None = None,
        prefix_cache_mb: int = 2048,
        kv_cache_mb: float = 4096,
        precision: str = "auto",
        sampler: str = "cdf",
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise TaskContractError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if isinstance(kv_cache_mb, bool) or not isinstance(kv_cache_mb, int | float) or not kv_cache_mb > 0:
            raise TaskContractError(f"kv_cache_mb must be a number > 0 (MiB), got {kv_cache_mb!r}")
        self.kv_cache_mb = kv_cache_mb
        self.model = model
        self.sampler = check_sampler(sampler)
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.precision = resolve_precision(check_precision(precision), dtype=dtype, device=model.device.type)
        """The precision the linear layers decode in (``precision`` resolved for this model and CPU)."""
        self._linears = Bf16Linears(model) if self.precision != dtype else None
        self.kv_dtype = next(model.parameters()).dtype
        """The torch dtype of the KV states (buffers and prefix cache): the model's, also where
        its linear layers decode in bf16 (why: :mod:`~optima_env.backends.precision`)."""
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.batch_size = batch_size
        supported = _kv.fast_path_supported(model)
        if fast and not supported:
            raise TaskContractError(
                f"the fast decode path supports {sorted(_kv.SUPPORTED_MODEL_TYPES)} with full attention, "
                f"got model_type {getattr(model.config, 'model_type', None)!r}; pass fast=None or False"
            )
        self.fast = supported if fast is None else fast
        self.prefix_cache: _kv.PrefixCache | None = None
        if self.fast and prefix_cache_mb > 0:
            per_token = _kv.kv_bytes_per_token(model, self.kv_dtype)
            self.prefix_cache = _kv.PrefixCache(max_tokens=prefix_cache_mb * 2**20 // per_token)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.stats = DecodeStats()
        self._weights: tuple[int, ...] = ()
        self._stream = StreamingDecoder(self)
        self._arena = _kv.Arena()

    @classmethod
    def from_pretrained(cls, name_or_path: str = "embedded", **kwargs: Any) -> TransformersPolicy:
        """Load a model with :func:`optima_env.models.load_model` (``dtype``, ``device``) and wrap it.

        A PEFT adapter folder is merged into its base model first, and brings its own tokenizer
        if it has one (:func:`optima_env.backends.peft_adapter.load_merged`).
        """
        from optima_env.backends.peft_adapter import is_adapter, load_merged
        from optima_env.models import load_model

        names = ("batch_size", "fast", "prefix_cache_mb", "kv_cache_mb", "precision", "sampler")
        own = {k: kwargs.pop(k) for k in names if k in kwargs}
        load = load_merged if is_adapter(name_or_path) else load_model
        model, tokenizer = load(name_or_path, **kwargs)
        return cls(model, tokenizer, **own)

    # -- public ---------------------------------------------------------------------------------
    @property
    def engine(self) -> dict[str, Any]:
        """The engine's numerics as stores record them
        (:func:`~optima_env.backends.precision.engine_record`)."""
        return engine_record(self.precision, self.sampler, mixed=self._linears is not None)

    @contextlib.contextmanager
    def decoding(self, *, fast: bool = True) -> Iterator[None]:
        """Inference mode, the engine's attention (``fast``) and its precision, while decoding."""
        torch = require("torch", "train")
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode())
            if fast:
                stack.enter_context(_kv.gqa_attention_for(self.model))
            if self._linears is not None:
                stack.enter_context(self._linears.active())
            yield

    def clear_cache(self) -> None:
        """Drop the KV states kept across calls (done automatically when the weights change) and
        the memory the batch KV buffers reuse."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        self._arena.clear()

    def _check_weights(self) -> None:
        """Clear the prefix cache when the model's parameters were replaced or updated in place.

        Optimizer steps, ``load_state_dict`` and adapter changes all bump the parameters' version
        counters or change the parameter set; writes through ``param.data`` do not (call
        :meth:`clear_cache` after those).
        """
        params = list(self.model.parameters())
        weights = (len(params), sum(id(p) for p in params), sum(p._version for p in params))
        if weights != self._weights:
            self.clear_cache()
            self._weights = weights

    # -- TurnEngine (continuous batching) -------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Requests decoded at once: ``batch_size`` (the slots of the streaming batch)."""
        return self.batch_size

    def submit(self, ticket: int, request: GenerationRequest, sampling: SamplingParams) -> None:
        """Queue ``request`` under ``ticket`` (:class:`~optima_env.policy.TurnEngine`); see :meth:`poll`."""
        self._stream.submit(ticket, request, sampling)

    def poll(self) -> list[tuple[int, str]]:
        """Decode until a submitted request is done; the ``(ticket, reply)`` pairs done (see the
        module docstring: continuous batching, or :meth:`generate` off the fast path)."""
        return self._stream.poll()

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        if not requests:
            return []
        ids = self._encode(requests)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: list[str] = [""] * len(ids)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            if self.fast:
                self._check_weights()
                seeds = [
                    None if sampling.seed is None else request_seed(sampling.seed, requests[i].key)
                    for i in chunk
                ]
                tokens = self._decode([ids[i] for i in chunk], seeds, sampling)
            else:
                tokens = self._hf_generate(
                    [ids[i].tolist() for i in chunk], [requests[i].key for i in chunk], sampling
                )
            texts = self.tokenizer.batch_decode(tokens, skip_special_tokens=True)
            for i, text in zip(chunk, texts):
                out[i] = finish_reply(requests[i].prefix, text, sampling.stop)
        return out

    def _encode(self, requests: Sequence[GenerationRequest]) -> list[np.ndarray]:
        """The token ids of each request's rendered prompt (counted in :attr:`stats`)."""
        prompts = [render_prompt(self.tokenizer, r) for r in requests]
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        self.stats.requests += len(ids)
        self.stats.prompt_tokens += sum(len(x) for x in ids)
        return [np.asarray(x, dtype=np.int64) for x in ids]

    # -- transformers' generate -----------------------------------------------------------------
    def _hf_generate(
        self, ids: list[list[int]], keys: list[tuple[object, ...]], sampling: SamplingParams
    ) -> list[list[int]]:
        torch = require("torch", "train")
        if sampling.seed is not None:
            torch.manual_seed((sampling.seed * 1_000_003 + zlib.crc32(repr(keys).encode())) % (2**31))
        enc = self.tokenizer.pad({"input_ids": ids}, return_tensors="pt")
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.eos_ids,
        )
        if sampling.ignore_eos:
            kwargs["min_new_tokens"] = sampling.max_new_tokens
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        if sampling.temperature > 0:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with self.decoding(fast=False):
            generated = self.model.generate(**enc, **kwargs)
        rows = generated[:, enc["input_ids"].shape[1] :].tolist()
        self.stats.prefilled_tokens += int(enc["attention_mask"].sum())
        self.stats.forward_passes += len(rows[0]) if rows else 0
        self.stats.decode_steps += len(rows[0]) if rows else 0
        self.stats.slot_steps += (len(rows[0]) if rows else 0) * self.batch_size
        stripped = [_strip_eos(row, self.eos_ids, self.tokenizer.pad_token_id) for row in rows]
        self.stats.generated_tokens += sum(min(len(s) + 1, len(r)) for s, r in zip(stripped, rows))
        return stripped

    # -- fast path ------------------------------------------------------------------------------
    def _decode(
        self, rows: list[np.ndarray], seeds: list[int | None], sampling: SamplingParams
    ) -> list[list[int]]:
        """Generate for one batch of token-id prompts; returns the new tokens of each (no EOS)."""
        with self.decoding():
            self._share_prefixes(rows)
            return self._run(rows, seeds, sampling)

    def _share_prefixes(self, rows: list[np.ndarray]) -> None:
        """Prefill once, into the prefix cache, the prefixes that several of ``rows`` share."""
        if self.prefix_cache is None or len(rows) < 2:
            return
        matched = [self.prefix_cache.lookup(r)[1] for r in rows]
        shared = _kv.shared_prefixes(rows, matched, min_gain=32)
        if shared:
            kv, logits, info = self._prefill(shared, extra=0)
            del logits
            for b, row in enumerate(shared):
                self._store(kv, b, info, row, fed=0)

    def _prefill(self, rows: list[np.ndarray], *, extra: int):
        """Prefill ``rows`` on top of their cached prefixes, in a buffer with ``extra`` free slots."""
        torch = require("torch", "train")
        device, dtype = self.model.device, self.kv_dtype
        layers, kv_heads, head_dim = _kv.kv_geometry(self.model)
        hits = []
        for row in rows:
            entry, n = self.prefix_cache.lookup(row) if self.prefix_cache is not None else (None, 0)
            n = min(n, len(row) - 1)
            hits.append((entry, n) if n > 0 else (None, 0))
        past = max(n for _, n in hits)
        new = [len(row) - n for row, (_, n) in zip(rows, hits)]
        width = max(new)
        batch = len(rows)
        buf = self._arena.take((layers, 2, batch, kv_heads, past + width + extra, head_dim), dtype, device)
        valid = torch.zeros(batch, past + width + extra, dtype=torch.bool, device=device)
        input_ids = torch.full((batch, width), self.tokenizer.pad_token_id, dtype=torch.long)
        positions = torch.zeros((batch, width), dtype=torch.long)
        for b, (row, (entry, n)) in enumerate(zip(rows, hits)):
            if past - n > 0:
                buf[:, :, b, :, : past - n].zero_()
            if n:
                buf[:, :, b, :, past - n : past].copy_(entry.kv[:, :, :, :n])
                valid[b, past - n : past] = True
            valid[b, past + width - new[b] : past + width] = True
            input_ids[b, width - new[b] :] = torch.from_numpy(row[n:])
            positions[b, width - new[b] :] = torch.arange(n, len(row))
        self.stats.prefilled_tokens += sum(new)
        end, logits = past + width, []
        for first, last in _kv.prefill_chunks(new, _kv.PREFILL_TOKENS):
            w = max(new[first:last])  # the chunk's own width: columns before it are padding for its rows
            start = end - w
            buf[:, :, first:last, :, past:start].zero_()
            causal = torch.ones(w, end, dtype=torch.bool, device=device).tril(start)
            allowed = valid[first:last, None, None, :end] & causal
            mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, _NEG)
            out = self.model(
                input_ids=input_ids[first:last, width - w :].to(device),
                attention_mask=mask,
                position_ids=positions[first:last, width - w :].to(device),
                past_key_values=_kv.BatchKV(buf[:, :, first:last, :, :end], start).cache(),
                use_cache=True,
                logits_to_keep=1,
            )
            logits.append(out.logits[:, -1].float())
            self.stats.forward_passes += 1
        info = {"valid": valid, "start": end, "lengths": [len(r) for r in rows]}
        return _kv.BatchKV(buf, end), torch.cat(logits), info

    def _store(self, kv: _kv.BatchKV, b: int, info: dict[str, Any], ids: np.ndarray, *, fed: int) -> None:
        """Copy row ``b``'s KV states (prompt plus ``fed`` generated tokens) into the prefix cache."""
        if self.prefix_cache is None:
            return
        end = info["start"] + fed
        index = info["valid"][b, :end].nonzero().squeeze(1)
        if len(index) != len(ids):  # pragma: no cover - internal invariant
            raise BackendError(f"internal error: {len(index)} cached positions for {len(ids)} tokens")
        self.prefix_cache.add(ids, _kv.gather_columns(kv.buf[:, :, b], index))

    # size: one decode loop over a shared KV cache: prefill, steps, stops, slots read as one unit
    def _run(
        self, rows: list[np.ndarray], seeds: list[int | None], sampling: SamplingParams
    ) -> list[list[int]]:
        torch = require("torch", "train")
        device = self.model.device
        steps = sampling.max_new_tokens
        kv, logits, info = self._prefill(rows, extra=steps)
        dtype = kv.buf.dtype
        generators = None
        if sampling.seed is not None and not sampling.greedy:
            generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        stop_window = max((len(s) for s in sampling.stop), default=0) + 2
        out: list[list[int]] = [[] for _ in rows]
        live = list(range(len(rows)))  # batch slot -> row
        done = [False] * len(rows)
        positions = torch.tensor(info["lengths"], dtype=torch.long, device=device)
        cache = kv.cache()
        for step in range(steps):
            suppress = self.eos_ids if sampling.ignore_eos else None
            tokens = sample_next(logits, sampling, generators, suppress, self.sampler)
            self.stats.decode_steps += 1
            self.stats.slot_steps += self.batch_size
            values = tokens.tolist()
            for slot, row in enumerate(live):
                if done[row]:
                    continue
                token = values[slot]
                out[row].append(token)
                if token in self.eos_ids and not sampling.ignore_eos:
                    done[row] = True
                elif sampling.stop and has_stop(self.tokenizer, out[row][-stop_window:], sampling.stop):
                    done[row] = True
            if step == steps - 1 or all(done[r] for r in live):
                break
            finished = [slot for slot, row in enumerate(live) if done[row]]
            if finished and len(finished) * 4 >= len(live):
                for slot in finished:
                    row = live[slot]
                    self._store(kv, slot, info, cached_ids(rows[row], out[row]), fed=len(out[row]) - 1)
                keep = [slot for slot, row in enumerate(live) if not done[row]]
                index = torch.tensor(keep, dtype=torch.long, device=device)
                kv.select(index)
                info["valid"] = info["valid"].index_select(0, index)
                positions = positions.index_select(0, index)
                tokens = tokens.index_select(0, index)
                if generators is not None:
                    generators = [generators[s] for s in keep]
                live = [live[s] for s in keep]
                cache = kv.cache()
            cursor = info["start"] + step
            info["valid"][:, cursor] = True
            mask = torch.zeros(len(live), 1, 1, cursor + 1, dtype=dtype, device=device)
            mask.masked_fill_(~info["valid"][:, None, None, : cursor + 1], _NEG)
            self.stats.count_decode(info["valid"][:, : cursor + 1])
            result = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=positions[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            positions = positions + 1
            self.stats.forward_passes += 1
            logits = result.logits[:, -1].float()
        for slot, row in enumerate(live):
            self._store(kv, slot, info, cached_ids(rows[row], out[row]), fed=len(out[row]) - 1)
        self.stats.generated_tokens += sum(len(o) for o in out)
        return [[t for t in o if t not in self.eos_ids] for o in out]


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = set()
    for value in (
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        tokenizer.eos_token_id,
    ):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if not ids:
        raise BackendError("the tokenizer has no eos_token_id; set tokenizer.eos_token before generating")
    return sorted(ids)


def _strip_eos(row: list[int], eos_ids: list[int], pad_id: int | None) -> list[int]:
    """Tokens up to the first end-of-sequence (padding after it dropped)."""
    for k, token in enumerate(row):
        if token in eos_ids:
            return row[:k]
    return [t for t in row if t != pad_id]
