"""Continuous batching for the transformers backend: the :class:`~optima_env.policy.TurnEngine`
side of :class:`~optima_env.backends.hf.TransformersPolicy` (the per-token helpers it shares with
the batch loop, sampling and stop strings, are in :mod:`optima_env.backends._tokens`).

:class:`StreamingDecoder` keeps one running batch of at most ``batch_size`` rows. Each sampling
round feeds the rows' last tokens through one decode step, prefills the queued requests that fit
in the free slots (on top of the prefix cache, as ``generate`` does) and samples one token for
every row, old and new alike; a row that ends (end of sequence, a stop string, ``max_new_tokens``)
leaves the batch at once, its slot goes to the next queued request, and :meth:`StreamingDecoder.poll`
returns its reply. Replies follow the fast path of ``generate`` token for token: the same
rendering, the same sampler with the same per-request generator (:func:`~optima_env.policy.request_seed`),
the same stop rule and reply cut, so a request gets the text it gets from ``generate``, up to
floating-point differences between batch shapes (which can only flip a near tie).

The KV states live in one buffer ``[layers, 2, rows, kv heads, width, head dim]`` (rows for the
requests that run, doubled as more join, at most ``batch_size``) whose first ``n`` rows are the
running ones. Every row writes its next token at the same column (the
cursor); a row admitted later is placed right-aligned before the cursor, so rows of different
lengths and ages share the buffer, the attention mask marking each row's own columns (keys are
stored after RoPE, so a column's place does not matter, only the mask). A finished row is
replaced by the batch's last row (one row copied); the buffer is reallocated only when the cursor
reaches its end or an admitted prompt is longer than the columns before the cursor, and the
reallocation drops the columns no running row uses any more. The policy's ``kv_cache_mb`` bounds
the buffer: a queued request waits while the running rows and it, each run to its
``max_new_tokens``, would not fit.

Why written by hand: transformers 5.19 ships ``generation.continuous_batching``
(``ContinuousBatchingManager``, ``model.init_continuous_batching``), checked first. It samples all
rows with one ``torch.multinomial`` from the global RNG seeded once per manager
(``DistributedHelper.set_tp_seed``), so a request's text depends on what else runs with it: no
per-request seeds, which the :class:`~optima_env.policy.ChatPolicy` contract and the replayable
rollouts need. It stops on end-of-sequence ids only (no stop strings), has no forced reply prefix
(a caller-side rendering), runs in a background thread with its own paged cache and attention
(``paged|sdpa``), and its prefix sharing is per cache block, not this backend's prefix cache of
earlier turns. Adapting it would mean replacing its sampler and stop logic, most of what is here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optima_env.backends import _kv
from optima_env.backends._tokens import cached_ids, has_stop, sample_next
from optima_env.errors import BackendError, OptimaError, TaskContractError, require
from optima_env.policy import GenerationRequest, SamplingParams, finish_reply, request_seed

__all__ = ["StreamingDecoder"]

_MIN_GROW = 64
"""Columns added at least when the buffer grows to the right."""


@dataclass(eq=False)
class _Queued:
    """One request waiting for a slot; its prompt is encoded once, when it first nears admission."""

    ticket: int
    request: GenerationRequest
    sampling: SamplingParams
    prompt: np.ndarray | None = None

    @property
    def most(self) -> int:
        """Tokens it may hold by the time it ends, once admitted (prompt plus ``max_new_tokens``)."""
        return len(self.prompt) + self.sampling.max_new_tokens


@dataclass(eq=False)
class _Row:
    """One request in the running batch."""

    ticket: int
    request: GenerationRequest
    sampling: SamplingParams
    prompt: np.ndarray
    position: int
    """Position id of the next token fed (prompt length + tokens fed so far)."""
    generator: Any = None
    out: list[int] = field(default_factory=list)

    @property
    def most(self) -> int:
        """Tokens the row may hold by the time it ends (prompt plus its ``max_new_tokens``)."""
        return len(self.prompt) + self.sampling.max_new_tokens


class StreamingDecoder:
    """Submit/poll continuous batching over a :class:`~optima_env.backends.hf.TransformersPolicy`.

    Uses the policy's model, tokenizer, prefix cache and :attr:`stats` (including
    ``decode_steps`` and ``slot_steps``: one round per sampled token of the batch, ``batch_size``
    slots each). Models off the fast path: :meth:`poll` answers everything queued with the
    policy's ``generate``.
    """

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.queue: deque[_Queued] = deque()
        self.rows: list[_Row] = []
        self._pending: set[int] = set()
        self._release()

    @property
    def running(self) -> int:
        """Rows in the running batch (at most ``batch_size``)."""
        return len(self.rows)

    def submit(self, ticket: int, request: GenerationRequest, sampling: SamplingParams) -> None:
        """Queue one request; nothing is generated until :meth:`poll`."""
        if isinstance(ticket, bool) or not isinstance(ticket, int):
            raise TaskContractError(f"ticket must be an int, got {ticket!r}")
        if ticket in self._pending:
            raise TaskContractError(
                f"ticket {ticket} is already pending; use a ticket unique among the pending requests"
            )
        if not isinstance(request, GenerationRequest) or not isinstance(sampling, SamplingParams):
            raise TaskContractError(
                "submit takes (ticket, GenerationRequest, SamplingParams), got "
                f"({type(request).__name__}, {type(sampling).__name__})"
            )
        self._pending.add(ticket)
        self.queue.append(_Queued(ticket, request, sampling))

    def poll(self) -> list[tuple[int, str]]:
        """Run sampling rounds until a row ends; the ``(ticket, reply)`` pairs that ended.

        ``[]`` when nothing is pending. Any failure drops every pending request and raises
        :class:`~optima_env.errors.BackendError` (an optima error, e.g. the chat template's
        :class:`~optima_env.errors.BackendError`, passes as it is).
        """
        if not self.queue and not self.rows:
            return []
        require("torch", "train")
        try:
            if not self.policy.fast:
                done = self._answer_with_generate()
            else:
                with self.policy.decoding():
                    done = []
                    while not done:
                        done = self._round()
        except BaseException as exc:  # an interrupt too: no request is left half admitted
            dropped = len(self._pending)
            self.queue.clear()
            self.rows.clear()
            self._pending.clear()
            self._release()
            if isinstance(exc, OptimaError) or not isinstance(exc, Exception):
                raise  # already says what went wrong (e.g. BackendError), or an interrupt
            raise BackendError(
                f"the transformers engine failed ({type(exc).__name__}: {exc}); its {dropped} pending "
                "requests were dropped: fix the cause and submit them again"
            ) from exc
        for ticket, _ in done:
            self._pending.discard(ticket)
        return done

    # -- one round ------------------------------------------------------------------------------
    def _round(self) -> list[tuple[int, str]]:
        """Decode step for the running rows, admission of queued ones, one token sampled per row."""
        torch = require("torch", "train")
        parts = []
        if self.rows:
            parts.append(self._decode_step())
        admitted = self._admit()
        if admitted is not None:
            parts.append(admitted)
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        stats = self.policy.stats
        stats.decode_steps += 1
        stats.slot_steps += self.policy.batch_size
        return self._advance(self._sample(logits))

    def _admit(self) -> Any:
        """Prefill the queued requests that fit into free slots; their next-token logits (or None)."""
        policy = self.policy
        free = policy.batch_size - len(self.rows)
        if free <= 0 or not self.queue:
            return None
        policy._check_weights()
        taken = self._fitting(free)
        if not taken:
            return None
        prompts = [queued.prompt for queued in taken]
        policy._share_prefixes(prompts)
        kv, logits, info = policy._prefill(prompts, extra=0)
        n = len(self.rows)
        upcoming = max(queued.sampling.max_new_tokens for queued in taken)
        self._ensure(left=max(len(p) for p in prompts), right=1, upcoming=upcoming, rows=n + len(taken))
        cursor = self.cursor
        torch = require("torch", "train")
        for b, (queued, prompt) in enumerate(zip(taken, prompts)):
            # each row right-aligned before the cursor without the prefill's padding, so the buffer
            # is as wide as its longest row, not as the prefill's cached prefix plus its longest tail
            index = info["valid"][b].nonzero().squeeze(1)
            row = self.buf[:, :, n + b, :, cursor - len(prompt) : cursor]
            _kv.gather_columns(kv.buf[:, :, b], index, out=row)
            self.valid[n + b] = False
            self.valid[n + b, cursor - len(prompt) : cursor] = True
            sampling, generator = queued.sampling, None
            if sampling.seed is not None and not sampling.greedy:
                seed = request_seed(sampling.seed, queued.request.key)
                generator = torch.Generator(device=policy.model.device).manual_seed(seed)
            self.rows.append(_Row(queued.ticket, queued.request, sampling, prompt, len(prompt), generator))
        self._cache = None
        return logits

    def _fitting(self, free: int) -> list[_Queued]:
        """Up to ``free`` queued requests, in order, taken off the queue while the KV budget allows.

        Admitting k requests to n running rows needs ``(n + k) x`` the most tokens any of them may
        hold (prompt plus ``max_new_tokens``) within the policy's ``kv_cache_mb``; a request is
        admitted alone, over the budget, when nothing else runs (it could never run otherwise).
        """
        head = [queued for _, queued in zip(range(free), self.queue)]
        fresh = [queued for queued in head if queued.prompt is None]
        if fresh:
            for queued, prompt in zip(fresh, self.policy._encode([q.request for q in fresh])):
                queued.prompt = prompt
        budget = self._budget_tokens()
        most = max((row.most for row in self.rows), default=0)
        taken: list[_Queued] = []
        for queued in head:
            most = max(most, queued.most)
            if (self.rows or taken) and (len(self.rows) + len(taken) + 1) * most > budget:
                break
            taken.append(queued)
        for _ in taken:
            self.queue.popleft()
        return taken

    def _budget_tokens(self) -> int:
        """The policy's ``kv_cache_mb`` in tokens of KV states."""
        policy = self.policy
        return int(policy.kv_cache_mb * 2**20) // _kv.kv_bytes_per_token(policy.model, policy.kv_dtype)

    def _decode_step(self) -> Any:
        """Feed every running row its last sampled token; the next-token logits."""
        torch = require("torch", "train")
        policy = self.policy
        device = policy.model.device
        n = len(self.rows)
        self._ensure(left=0, right=1)
        cursor = self.cursor
        if self._cache is None:
            self._cache = _kv.BatchKV(self.buf[:, :, :n], cursor).cache()
        self.valid[:n, cursor] = True
        mask = torch.zeros(n, 1, 1, cursor + 1, dtype=self.buf.dtype, device=device)
        mask.masked_fill_(~self.valid[:n, None, None, : cursor + 1], _kv.NEG)
        policy.stats.count_decode(self.valid[:n, : cursor + 1])
        tokens = torch.tensor([[row.out[-1]] for row in self.rows], dtype=torch.long, device=device)
        positions = torch.tensor([[row.position] for row in self.rows], dtype=torch.long, device=device)
        result = policy.model(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self._cache,
            use_cache=True,
        )
        self.cursor += 1
        for row in self.rows:
            row.position += 1
        policy.stats.forward_passes += 1
        return result.logits[:, -1].float()

    def _sample(self, logits: Any) -> list[int]:
        """One token per row, each group of rows with equal sampling parameters sampled together."""
        torch = require("torch", "train")
        groups: dict[SamplingParams, list[int]] = {}
        for i, row in enumerate(self.rows):
            groups.setdefault(row.sampling, []).append(i)
        tokens = [0] * len(self.rows)
        for sampling, index in groups.items():
            part = logits if len(index) == len(self.rows) else logits[torch.tensor(index)]
            generators = None
            if sampling.seed is not None and not sampling.greedy:
                generators = [self.rows[i].generator for i in index]
            suppress = self.policy.eos_ids if sampling.ignore_eos else None
            drawn = sample_next(part, sampling, generators, suppress, self.policy.sampler)
            for i, token in zip(index, drawn.tolist()):
                tokens[i] = token
        return tokens

    def _advance(self, tokens: list[int]) -> list[tuple[int, str]]:
        """Append the sampled tokens; the rows that ended leave the batch with their replies."""
        policy = self.policy
        eos = policy.eos_ids
        ended = []
        for i, (row, token) in enumerate(zip(self.rows, tokens)):
            row.out.append(token)
            sampling = row.sampling
            window = max((len(s) for s in sampling.stop), default=0) + 2
            if (
                (token in eos and not sampling.ignore_eos)
                or len(row.out) >= sampling.max_new_tokens
                or (sampling.stop and has_stop(policy.tokenizer, row.out[-window:], sampling.stop))
            ):
                ended.append(i)
        policy.stats.generated_tokens += len(tokens)
        done = []
        for i in reversed(ended):
            row = self.rows[i]
            self._store(i, row)
            text = policy.tokenizer.decode([t for t in row.out if t not in eos], skip_special_tokens=True)
            done.append((row.ticket, finish_reply(row.request.prefix, text, row.sampling.stop)))
            self._remove(i)
        if not self.rows and not self.queue:
            self._release()
        return done

    # -- the KV buffer --------------------------------------------------------------------------
    def _release(self) -> None:
        """Drop the KV buffer (nothing runs)."""
        self.buf: Any = None
        self.valid: Any = None
        self.cursor = 0
        self._cache: Any = None

    def _store(self, i: int, row: _Row) -> None:
        """Copy row ``i``'s KV states (prompt and fed tokens) into the policy's prefix cache."""
        cache = self.policy.prefix_cache
        if cache is None:
            return
        ids = cached_ids(row.prompt, row.out)
        index = self.valid[i, : self.cursor].nonzero().squeeze(1)
        if len(index) != len(ids):  # pragma: no cover - internal invariant
            raise BackendError(f"internal error: {len(index)} cached positions for {len(ids)} tokens")
        cache.add(ids, _kv.gather_columns(self.buf[:, :, i], index))

    def _remove(self, i: int) -> None:
        """Take row ``i`` out of the batch: the last row moves into its slot."""
        last = len(self.rows) - 1
        if i != last:
            self.buf[:, :, i, :, : self.cursor].copy_(self.buf[:, :, last, :, : self.cursor])
            self.valid[i] = self.valid[last]
            self.rows[i] = self.rows[last]
        self.rows.pop()
        self._cache = None

    def _ensure(self, *, left: int, right: int, upcoming: int = 0, rows: int = 0) -> None:
        """At least ``left`` columns before the cursor and ``right`` from it, and room for ``rows``
        rows; reallocates if not.

        A reallocation keeps the running rows' columns from the first one any row uses, so the
        columns of rows that left are dropped, and adds room to the right for
        ``max(right, 64, half the kept width)`` tokens, capped at the longest a running row (or an
        ``upcoming`` one) may still generate. Rows are allocated for the requests that run, not
        for every slot (the next power of two, at most ``batch_size``): the buffer's size is rows x
        columns, and a 32-slot engine playing 4 long conversations held 3.2x the memory of a 4-slot
        one. The spare rows and columns are cut to keep the buffer within ``kv_cache_mb`` (down to
        what the running rows need).
        """
        if (
            self.buf is not None
            and self.cursor >= left
            and self.buf.shape[4] - self.cursor >= right
            and self.buf.shape[2] >= rows
        ):
            return
        torch = require("torch", "train")
        model = self.policy.model
        n = len(self.rows)
        first = self.cursor
        if n and self.buf is not None:
            used = self.valid[:n, : self.cursor].any(0).nonzero()
            first = int(used[0]) if len(used) else self.cursor
        kept = self.cursor - first
        pad = max(left - kept, 0)
        cursor = pad + kept
        remaining = max((r.sampling.max_new_tokens - len(r.out) for r in self.rows), default=upcoming)
        remaining = max(remaining, upcoming)
        need, budget = max(rows, n, 1), self._budget_tokens()
        slots = min(self.policy.batch_size, 1 << (need - 1).bit_length())
        slots = max(need, min(slots, budget // (cursor + right)))
        grow = max(right, min(max(_MIN_GROW, kept // 2), remaining + 1, budget // slots - cursor))
        layers, kv_heads, head_dim = _kv.kv_geometry(model)
        dtype = self.policy.kv_dtype
        buf = torch.zeros(
            layers, 2, slots, kv_heads, cursor + grow, head_dim, dtype=dtype, device=model.device
        )
        valid = torch.zeros(slots, cursor + grow, dtype=torch.bool, device=model.device)
        if kept and n:
            buf[:, :, :n, :, pad:cursor].copy_(self.buf[:, :, :n, :, first : self.cursor])
            valid[:n, pad:cursor] = self.valid[:n, first : self.cursor]
        self.buf, self.valid, self.cursor, self._cache = buf, valid, cursor, None

    # -- models off the fast path ---------------------------------------------------------------
    def _answer_with_generate(self) -> list[tuple[int, str]]:
        """Everything queued, answered by the policy's ``generate``, one batch per sampling."""
        groups: dict[SamplingParams, list[tuple[int, GenerationRequest]]] = {}
        while self.queue:
            queued = self.queue.popleft()
            groups.setdefault(queued.sampling, []).append((queued.ticket, queued.request))
        done = []
        for sampling, items in groups.items():
            replies = self.policy.generate([request for _, request in items], sampling)
            done.extend((ticket, reply) for (ticket, _), reply in zip(items, replies))
        return done
