"""KV-cache machinery of the transformers backend: a preallocated batch cache, a GQA attention
kernel that never copies the cache, and a prefix cache that keeps KV states across turns.

Why (measured in ``benchmarks/throughput/rollout_bench.py``): with transformers' default ``DynamicCache`` every
decode step re-allocates the whole batch cache (``torch.cat``), and its SDPA path expands the
grouped KV heads (``repeat_kv``) of the whole cache again in every layer, so a batched decode step
on a small model moves several times the cache per token. Here the cache is one buffer allocated
per batch and written in place, and attention groups the query heads by KV head instead.

Multi-turn conversations re-read their whole history at every turn; :class:`PrefixCache` keeps
the KV states of earlier prompts (and of the replies generated after them) keyed by token ids, so
a turn only prefills the tokens that are new since the longest cached prefix, and samples of
one instance share their system prompt. A prefill runs in chunks of rows
(:func:`prefill_chunks`).

Everything here imports torch lazily (inside functions): the module is imported by
:mod:`optima_env.backends.hf` only.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

NEG = -1e9
"""Additive mask value: finite, so a fully masked padding row gives finite junk, never NaN."""

PREFILL_TOKENS = 512
"""Positions a prefill runs through the model at once at most (:func:`prefill_chunks`)."""

ATTENTION_NAME = "optima_gqa"
"""Name under which :func:`gqa_attention` is registered in transformers' AttentionInterface."""

SUPPORTED_MODEL_TYPES = frozenset(
    {"llama", "qwen2", "qwen3", "mistral", "granite", "olmo", "olmo2", "phi3", "smollm3", "helium"}
)
"""Decoder-only models with full (non-sliding) RoPE attention that the fast path is checked on."""


def fast_path_supported(model: Any) -> bool:
    """Whether ``model`` is a causal LM whose every layer is plain full attention (no sliding window).

    Also needs PyTorch >= 2.5 (grouped-query attention in ``scaled_dot_product_attention``).
    """
    import torch

    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 5):
        return False
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    sliding = getattr(config, "sliding_window", None)
    return sliding is None or getattr(config, "use_sliding_window", True) is False


def kv_geometry(model: Any) -> tuple[int, int, int]:
    """``(layers, kv heads, head dim)`` of a decoder."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, kv_heads, head_dim


def kv_bytes_per_token(model: Any, dtype: Any = None) -> int:
    """Bytes of one token's KV states (keys and values of every layer) in ``dtype`` (a torch dtype;
    the model's by default)."""
    layers, kv_heads, head_dim = kv_geometry(model)
    size = (dtype.itemsize if dtype is not None else next(model.parameters()).element_size())
    return layers * 2 * kv_heads * head_dim * size


def gqa_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention for grouped KV heads without expanding the cache (``enable_gqa`` of PyTorch's SDPA).

    ``query`` is ``[B, Hq, q, D]``; ``key``/``value`` are ``[B, Hkv, L, D]`` (views of the
    cache buffer); ``attention_mask`` is the additive ``[B, 1, q, L]`` mask built by the decode
    loop (finite large negatives, so a fully masked padding row gives finite junk, never NaN).
    A cache in another dtype than the query (bf16 KV states of an fp32 model,
    :mod:`optima_env.backends.precision`) is attended in the cache's dtype, the output cast back.
    """
    import torch

    dtype = query.dtype
    if key.dtype != dtype:
        query = query.to(key.dtype)
        attention_mask = None if attention_mask is None else attention_mask.to(key.dtype)
    q_len, kv_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        allowed = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
        attention_mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
        attention_mask.masked_fill_(~allowed, -1e9)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous().to(dtype), None


_registered = False


def register_attention() -> None:
    """Register :func:`gqa_attention` with transformers (once per process)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, gqa_attention)
    _registered = True


class BatchKV:
    """A preallocated KV buffer for one batch: ``[layers, 2, B, Hkv, capacity, D]``.

    :meth:`cache` wraps it as a transformers ``Cache`` whose layers write new states in place
    and return views, so nothing is copied per step.
    """

    def __init__(self, buf: Any, length: int) -> None:
        self.buf = buf
        self.length = length

    def cache(self) -> Any:
        """A transformers ``Cache`` over the buffer (its layers write in place and return views)."""
        from transformers.cache_utils import Cache

        layer = _layer_class()
        return Cache(layers=[layer(self, i) for i in range(self.buf.shape[0])])

    def select(self, rows: Any) -> None:
        """Keep only ``rows`` (a LongTensor of batch indices), e.g. when episodes finished."""
        self.buf = self.buf.index_select(2, rows)


class Arena:
    """One allocation that the decode loop's batch KV buffers reuse, grown to the largest asked for.

    Why: a batch's KV buffer is large (32 rows of 600 columns of SmolLM2-135M in fp32 are 885 MB),
    and glibc maps an allocation that size fresh from the operating system and unmaps it when it
    is freed, so every batch paid again for the kernel's page faults and its zeroing of every new
    page. Kept between batches (until :meth:`clear`), the memory is faulted in once. Each view
    :meth:`take` hands out shares the memory of the one before it: a caller is done with a buffer
    before it takes the next.
    """

    def __init__(self) -> None:
        self._flat: Any = None

    def take(self, shape: Sequence[int], dtype: Any, device: Any) -> Any:
        """An uninitialized tensor of ``shape`` over the kept memory (reallocated when too small)."""
        import torch

        numel = int(np.prod(shape))
        flat = self._flat
        if flat is None or flat.numel() < numel or flat.dtype != dtype or flat.device != device:
            self._flat = None  # the old memory goes back before the new is taken
            flat = self._flat = torch.empty(numel, dtype=dtype, device=device)
        return flat[:numel].view(*shape)

    def clear(self) -> None:
        """Give the memory back."""
        self._flat = None


def gather_columns(states: Any, index: Any, out: Any = None) -> Any:
    """``states.index_select(-2, index)`` for an increasing ``index``, copied run by run; into
    ``out`` (a tensor, or a view, of the result's shape) when given, so a caller that copies the
    columns somewhere copies them once.

    A row's valid KV columns are a few contiguous runs (its cached prefix, its new tokens, its
    generated ones); copying each run as a slice is a plain memory copy, where ``index_select``
    gathers column by column and took about twice as long on the rollout suite's stores.
    """
    import torch

    columns = index.cpu().numpy()
    cuts = np.flatnonzero(np.diff(columns) != 1) + 1
    runs = [states[..., int(run[0]) : int(run[-1]) + 1, :] for run in np.split(columns, cuts) if len(run)]
    if out is None:
        if len(runs) == 1:
            return runs[0].clone(memory_format=torch.contiguous_format)
        return torch.cat(runs, dim=-2) if runs else states[..., :0, :].clone()
    if len(columns) != out.shape[-2]:
        raise ValueError(
            f"gather_columns: out must hold the {len(columns)} columns the index selects, "
            f"got {out.shape[-2]}; pass an out as wide as the index"
        )
    at = 0
    for run in runs:
        out[..., at : at + run.shape[-2], :].copy_(run)
        at += run.shape[-2]
    return out


@dataclass(eq=False)
class _Entry:
    ids: np.ndarray
    kv: Any  # tensor [layers, 2, Hkv, len, D]
    tick: int


class PrefixCache:
    """Least-recently-used store of KV states keyed by token ids, reused by longest common prefix.

    Args:
        max_tokens: total cached tokens kept; the least recently used entries are dropped beyond it.
        min_match: a match shorter than this is not worth a lookup's copy and is ignored.
    """

    def __init__(self, max_tokens: int, *, min_match: int = 16) -> None:
        self.max_tokens = max_tokens
        self.min_match = min_match
        self._entries: list[_Entry] = []
        self._tick = 0

    @property
    def tokens(self) -> int:
        """Tokens currently cached."""
        return sum(len(e.ids) for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()

    def lookup(self, ids: np.ndarray) -> tuple[_Entry | None, int]:
        """The entry sharing the longest prefix with ``ids``, and that prefix's length."""
        best, best_len = None, 0
        for entry in self._entries:
            n = common_prefix(entry.ids, ids)
            if n > best_len:
                best, best_len = entry, n
        if best is None or best_len < self.min_match:
            return None, 0
        self._tick += 1
        best.tick = self._tick
        return best, best_len

    def add(self, ids: np.ndarray, kv: Any) -> None:
        """Store ``kv`` for ``ids``; entries that are a prefix of ``ids`` are superseded and dropped."""
        if len(ids) < self.min_match or len(ids) > self.max_tokens:
            return
        self._entries = [
            e
            for e in self._entries
            if not (len(e.ids) <= len(ids) and common_prefix(e.ids, ids) == len(e.ids))
        ]
        self._tick += 1
        self._entries.append(_Entry(ids=ids, kv=kv, tick=self._tick))
        total = self.tokens
        if total > self.max_tokens:
            for entry in sorted(self._entries, key=lambda e: e.tick):
                if total <= self.max_tokens:
                    break
                self._entries.remove(entry)
                total -= len(entry.ids)


@functools.cache
def _layer_class() -> type:
    """The cache layer class of :meth:`BatchKV.cache`, defined once.

    A class made anew per call would sit in a reference cycle (every class does) with the buffer
    in its closure, so each decode step's buffer would live until the next full garbage
    collection: a 2WikiMultihopQA MAD rollout held 3.3 GB of dead buffers that way.
    """
    from transformers.cache_utils import DynamicLayer

    class _Layer(DynamicLayer):
        def __init__(self, owner: BatchKV, index: int) -> None:
            super().__init__()
            self.owner, self.index = owner, index
            self.is_initialized = True
            self.dtype, self.device = owner.buf.dtype, owner.buf.device
            self.keys = owner.buf[index, 0, :, :, : owner.length]
            self.values = owner.buf[index, 1, :, :, : owner.length]

        def update(self, key_states, value_states, *args, **kwargs):
            owner = self.owner
            start = self.keys.shape[-2]
            end = start + key_states.shape[-2]
            owner.buf[self.index, 0, :, :, start:end].copy_(key_states)
            owner.buf[self.index, 1, :, :, start:end].copy_(value_states)
            self.keys = owner.buf[self.index, 0, :, :, :end]
            self.values = owner.buf[self.index, 1, :, :, :end]
            if self.index == owner.buf.shape[0] - 1:
                owner.length = end
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.keys.shape[-2]

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.keys.shape[-2] + query_length, 0

    return _Layer


def prefill_chunks(new: list[int], tokens: int) -> list[tuple[int, int]]:
    """``(first, last)`` row ranges of a prefill, in order, each as many rows as fit ``tokens``
    positions at the chunk's own width (its longest row's new tokens), at least one row.

    Why: a prefill's element-wise ops (norms, rotary, the MLP's gate) and its casts at the bf16
    linear layers run over every position; over a whole batch's positions their activations
    outgrow the CPU caches, while chunks of a few hundred positions stay in them and still feed
    the GEMMs enough rows. A chunk of short rows also pads only to its own longest.

    >>> prefill_chunks([100, 300, 200, 50, 60], 512)
    [(0, 1), (1, 2), (2, 4), (4, 5)]
    """
    chunks, first, widest = [], 0, 0
    for row, n in enumerate(new):
        widest = max(widest, n)
        if row > first and (row - first + 1) * widest > tokens:
            chunks.append((first, row))
            first, widest = row, n
    chunks.append((first, len(new)))
    return chunks


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D integer arrays.

    >>> common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5]))
    2
    """
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def shared_prefixes(rows: Sequence[np.ndarray], matched: Sequence[int], *, min_gain: int) -> list[np.ndarray]:
    """Prefixes worth prefilling once because several rows of a batch share them.

    For each row, the longest prefix it shares with another row (at most its length minus one);
    kept when it extends the row's cached match by at least ``min_gain`` tokens. A prefix that is
    itself a prefix of another kept one is dropped (the longer entry serves both).
    """
    order = sorted(range(len(rows)), key=lambda i: rows[i].tolist())
    best = [0] * len(rows)
    for a, b in itertools.pairwise(order):
        n = common_prefix(rows[a], rows[b])
        best[a] = max(best[a], n)
        best[b] = max(best[b], n)
    found: dict[bytes, np.ndarray] = {}
    for i, row in enumerate(rows):
        n = min(best[i], len(row) - 1)
        if n - matched[i] >= min_gain:
            found.setdefault(row[:n].tobytes(), row[:n])
    prefixes = sorted(found.values(), key=len, reverse=True)
    kept: list[np.ndarray] = []
    for p in prefixes:
        if not any(common_prefix(k, p) == len(p) for k in kept):
            kept.append(p)
    return kept


@contextlib.contextmanager
def gqa_attention_for(model: Any):
    """Route the model's attention through :func:`gqa_attention` meanwhile."""
    register_attention()
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = previous


def decode_roofline(
    model: Any, *, batch: int, context: int, steps: int = 8, fast: bool = True, clock: Any = time.perf_counter
) -> float:
    """Tokens per second of forward-only decode steps: ``batch`` rows over a ``context``-token KV cache.

    No sampling, no prefill, no Python bookkeeping beyond the forward call: the rate generation at
    this batch size cannot beat. ``fast`` uses the fast path's KV buffer and attention; otherwise
    transformers' default ``DynamicCache`` and attention. The cache holds zeros (the cost of a
    step does not depend on the values). ``clock`` is wall-clock time by default; pass
    ``time.process_time`` for tokens per CPU-second.
    """
    import torch
    from transformers import DynamicCache

    device = model.device
    dtype = next(model.parameters()).dtype
    layers, kv_heads, head_dim = kv_geometry(model)
    vocab = model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, steps + 1), generator=generator).to(device)
    valid = torch.ones(batch, context + steps + 1, dtype=torch.bool, device=device)
    valid[0, 0] = False  # one padded position, as in any batch of prompts of different lengths
    with torch.inference_mode(), gqa_attention_for(model) if fast else contextlib.nullcontext():
        if fast:
            kv = BatchKV(
                torch.zeros(
                    layers, 2, batch, kv_heads, context + steps + 1, head_dim, dtype=dtype, device=device
                ),
                context,
            )
            cache = kv.cache()
        else:
            cache = DynamicCache()
            for layer in range(layers):
                zeros = torch.zeros(batch, kv_heads, context, head_dim, dtype=dtype, device=device)
                cache.update(zeros, zeros.clone(), layer)
        started = 0.0
        for step in range(steps + 1):  # step 0 warms up
            if step == 1:
                started = clock()
            length = context + step + 1
            if fast:
                mask = torch.zeros(batch, 1, 1, length, dtype=dtype, device=device)
                mask.masked_fill_(~valid[:, None, None, :length], NEG)
            else:
                mask = valid[:, :length].long()
            position = torch.full((batch, 1), context + step, dtype=torch.long, device=device)
            model(
                input_ids=tokens[:, step : step + 1],
                attention_mask=mask,
                position_ids=position,
                past_key_values=cache,
                use_cache=True,
            )
        if device.type == "cuda":
            torch.cuda.synchronize()
        return batch * steps / (clock() - started)
