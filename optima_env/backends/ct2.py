"""CTranslate2 backend: batched generation with int8 or float32 weights, made for CPUs.

:class:`CTranslate2Policy` serves the :class:`~optima_env.policy.ChatPolicy` interface with
``ctranslate2.Generator.generate_batch``. Prompts are rendered exactly as in the transformers and
vLLM backends (the chat template, then the forced ``"Name:"`` prefix) and passed as tokens.
CTranslate2 prefills only a batch's shortest prompt length at once and feeds the rest of each
longer prompt one token per decoding step, so a call is split into ``generate_batch`` calls of
similar prompt lengths (:func:`length_groups`; on this machine 32 prompts of 61-370 tokens went
from 12.5 to 33-37 tok/s, int8, one thread); each drops finished rows as it goes and stops at
the model's end-of-sequence tokens. Stop strings (:func:`~optima_env.policy.speaker_stops` included) end a
row early through the library's per-token callback (the last few tokens are decoded and searched),
and the reply is cut before the first one, as on every backend. Sampling maps to
``sampling_temperature`` / ``sampling_topp`` / ``sampling_topk`` (``top_k`` of the policy, 0 = the
whole vocabulary, as the other backends sample); ``temperature == 0`` is greedy (``sampling_topk=1``).

Models are converted once per weights (:func:`~optima_env.backends.ct2_convert.convert_model`):
``embedded``, a hub name, a model folder or a PEFT LoRA adapter folder (merged first).

**Seeds: per batch, not per request.** CTranslate2 has no per-request seed: every row of a batch
draws from one random generator, a ``thread_local std::mt19937`` of the worker thread that is
seeded from ``ctranslate2.set_random_seed`` once, at that thread's first draw (calling it again
later has no effect: OpenNMT/CTranslate2#1757, checked here with 4.8.5). So with
``SamplingParams.seed`` set, a call (1) puts the requests in a canonical order (by prompt length,
key, then prompt), (2) seeds the library with :func:`~optima_env.policy.request_seed` of the base
seed and all the keys in that order, and (3) runs on a worker that has not drawn yet: the first
call after loading does; every later sampled call reloads the model (fresh worker threads;
measured here 0.25 s for int8, 1.4 s for float32 SmolLM2-135M; ``reseed=False`` skips it and
gives up reproducibility). What is guaranteed: the same set of requests with the same base seed
gets the same replies, in any order, across calls, policies and processes (same model and
settings, ``inter_threads=1``). What is not: a request's reply depends on which other requests
share its call, so a resumed rollout (whose batches hold other episodes than the uninterrupted
run's) samples other, equally valid text for the episodes it replays; the transformers fast
path, which seeds each request on its own, does not have this limitation.

Install with ``pip install 'optima[ct2]'`` (the converter also needs the ``train`` extra).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optima_env.backends.hf import render_prompt
from optima_env.errors import BackendError, TaskContractError, require
from optima_env.policy import GenerationRequest, SamplingParams, finish_reply, request_seed

__all__ = ["CT2Stats", "CTranslate2Policy", "length_groups"]

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class CT2Stats:
    """Running totals of one :class:`CTranslate2Policy` (reset by assigning a new one)."""

    requests: int = 0
    """Requests answered."""
    prompt_tokens: int = 0
    """Tokens of the rendered prompts (all prefilled: CTranslate2 keeps no cache across calls)."""
    generated_tokens: int = 0
    """Tokens generated, end-of-sequence tokens included."""
    reloads: int = 0
    """Model reloads for seeded calls (see the module docstring)."""
    reload_seconds: float = 0.0
    """Time they took."""


class CTranslate2Policy:
    """A :class:`~optima_env.policy.ChatPolicy` over a ``ctranslate2.Generator``.

    Args:
        model_dir: a CTranslate2 model folder (from :func:`~optima_env.backends.ct2_convert.convert_model`).
        tokenizer: the Hugging Face tokenizer (default: the one saved in ``model_dir``).
        compute_type: ``int8`` (the CPU default), ``int8_float32``, ``float32``, or any type
            ``ctranslate2.get_supported_compute_types(device)`` lists.
        device: ``cpu`` or ``cuda``.
        intra_threads: OpenMP threads per generation (0: CTranslate2's default, all cores).
        inter_threads: generations run in parallel (chunks of one call are shared among them).
        batch_size: rows per forward batch (``max_batch_size``; larger calls are split).
        top_k: sample from the ``top_k`` likeliest tokens (0: the whole vocabulary).
        reseed: reload the model before a seeded call when its workers have already drawn
            (reproducible seeds; see the module docstring).
        group_cost: how readily a call is split into groups of similar prompt lengths
            (:func:`length_groups`; larger: fewer, larger groups).
    """

    # size: CTranslate2's generator options, mirrored as keyword arguments with defaults
    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        tokenizer: Any = None,
        *,
        compute_type: str = "int8",
        device: str = "cpu",
        intra_threads: int = 0,
        inter_threads: int = 1,
        batch_size: int = 32,
        top_k: int = 0,
        reseed: bool = True,
        group_cost: float = 3.0,
    ) -> None:
        ctranslate2 = require("ctranslate2", "ct2")
        for name, value, low in (
            ("batch_size", batch_size, 1),
            ("intra_threads", intra_threads, 0),
            ("inter_threads", inter_threads, 1),
            ("top_k", top_k, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise TaskContractError(f"{name} must be an int >= {low}, got {value!r}")
        supported = sorted(ctranslate2.get_supported_compute_types(device))
        if compute_type not in supported:
            raise BackendError(
                f"compute_type {compute_type!r} is not supported on {device!r}; this build supports "
                f"{supported}"
            )
        self.model_dir = Path(model_dir)
        if tokenizer is None:
            tokenizer = require("transformers", "train").AutoTokenizer.from_pretrained(self.model_dir)
        self.tokenizer = tokenizer
        self.compute_type = compute_type
        self.device = device
        self.intra_threads = intra_threads
        self.inter_threads = inter_threads
        self.batch_size = batch_size
        self.top_k = top_k
        self.reseed = reseed
        self.group_cost = group_cost
        self.eos_ids = _eos_ids(self.model_dir, tokenizer)
        self.stats = CT2Stats()
        self.generator: Any = None
        self._drawn = False
        self._load()

    # size: the constructor's keyword options, forwarded (CTranslate2 conversion + generator)
    @classmethod
    def from_pretrained(
        cls,
        model: str = "embedded",
        *,
        compute_type: str = "int8",
        intra_threads: int = 0,
        inter_threads: int = 1,
        batch_size: int = 32,
        device: str = "cpu",
        top_k: int = 0,
        reseed: bool = True,
        group_cost: float = 3.0,
        cache_root: str | os.PathLike[str] | None = None,
    ) -> CTranslate2Policy:
        """Convert ``model`` once (cached by content hash) and load it.

        Args:
            model: ``embedded``, a hub name, a model folder, or a trainer checkpoint (a merged
                model folder, or a PEFT adapter folder whose adapter is merged before conversion).
            compute_type: the weights' type; each type is converted (and cached) on its own.
            cache_root: where converted models live (default ``<optima cache>/ct2``).
            **others**: as in the constructor.
        """
        require("ctranslate2", "ct2")
        from optima_env.backends.ct2_convert import convert_model

        folder = convert_model(model, compute_type=compute_type, root=cache_root)
        return cls(
            folder,
            compute_type=compute_type,
            device=device,
            intra_threads=intra_threads,
            inter_threads=inter_threads,
            batch_size=batch_size,
            top_k=top_k,
            reseed=reseed,
            group_cost=group_cost,
        )

    def _load(self) -> float:
        """(Re)load the generator on fresh worker threads; returns the seconds it took."""
        ctranslate2 = require("ctranslate2", "ct2")
        started = time.perf_counter()
        self.generator = None  # free the old weights first
        try:
            self.generator = ctranslate2.Generator(
                str(self.model_dir),
                device=self.device,
                compute_type=self.compute_type,
                intra_threads=self.intra_threads,
                inter_threads=self.inter_threads,
            )
        except Exception as exc:
            raise BackendError(
                f"CTranslate2 could not load {self.model_dir} ({type(exc).__name__}: {exc}); delete the "
                "folder to convert the model again"
            ) from exc
        self._drawn = False
        return time.perf_counter() - started

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        """One reply per request (see :class:`~optima_env.policy.ChatPolicy` and the module docstring)."""
        if not requests:
            return []
        if self.generator is None:
            raise BackendError("this CTranslate2Policy was closed; build a new one")
        prompts = [render_prompt(self.tokenizer, r) for r in requests]
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        order = sorted(range(len(requests)), key=lambda i: (len(ids[i]), repr(requests[i].key), prompts[i]))
        if not sampling.greedy:
            self._seed(sampling, [requests[i].key for i in order])
        stopper = _StopWatch(self.tokenizer, sampling.stop, len(order)) if sampling.stop else None
        groups = length_groups(
            [len(ids[i]) for i in order], sampling.max_new_tokens, self.batch_size, self.group_cost
        )
        results = []
        for start, stop in groups:
            try:
                results += self.generator.generate_batch(
                    [self.tokenizer.convert_ids_to_tokens(ids[i]) for i in order[start:stop]],
                    callback=None if stopper is None else stopper.offset(start),
                    **self._options(sampling),
                )
            except Exception as exc:
                raise BackendError(
                    f"CTranslate2 failed on a batch of {stop - start} prompts ({type(exc).__name__}: {exc})"
                ) from exc
        sequences = [list(r.sequences_ids[0]) for r in results]
        texts = self.tokenizer.batch_decode(sequences, skip_special_tokens=True)
        out = [""] * len(requests)
        for i, text in zip(order, texts):
            out[i] = finish_reply(requests[i].prefix, text, sampling.stop)
        self.stats.requests += len(requests)
        self.stats.prompt_tokens += sum(len(x) for x in ids)
        for row, seq in enumerate(sequences):
            stopped = stopper is not None and stopper.stopped[row]
            ended = len(seq) < sampling.max_new_tokens and not stopped and not sampling.ignore_eos
            self.stats.generated_tokens += len(seq) + int(ended)
        return out

    def _options(self, sampling: SamplingParams) -> dict[str, Any]:
        options: dict[str, Any] = dict(
            max_length=sampling.max_new_tokens,
            include_prompt_in_result=False,
            max_batch_size=self.batch_size,
            end_token=self.eos_ids,
        )
        if sampling.ignore_eos:
            options["min_length"] = sampling.max_new_tokens
        if sampling.greedy:
            options["sampling_topk"] = 1
        else:
            options.update(
                sampling_topk=self.top_k,
                sampling_topp=sampling.top_p,
                sampling_temperature=sampling.temperature,
            )
        return options

    def _seed(self, sampling: SamplingParams, keys: list[tuple[object, ...]]) -> None:
        """Before a sampled call: seed the library, on fresh workers when the seed is set."""
        if sampling.seed is not None:
            if self._drawn and self.reseed:
                seconds = self._load()
                self.stats.reloads += 1
                self.stats.reload_seconds += seconds
            require("ctranslate2", "ct2").set_random_seed(request_seed(sampling.seed, tuple(keys)))
        self._drawn = True

    def close(self) -> None:
        """Release the model."""
        self.generator = None

    def __enter__(self) -> CTranslate2Policy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _StopWatch:
    """The per-token callback: ends a row once its last tokens spell one of the stop strings."""

    def __init__(self, tokenizer: Any, stop: Sequence[str], rows: int) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.window = max(len(s) for s in stop) + 2  # tokens: each is at least one character
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.stopped = [False] * rows

    def offset(self, start: int) -> Callable[[Any], bool]:
        """The callback of one ``generate_batch`` call whose rows begin at row ``start``."""

        def callback(step: Any) -> bool:
            row = start + step.batch_id
            tokens = self.tokens[row]
            tokens.append(step.token_id)
            text = self.tokenizer.decode(tokens[-self.window :], skip_special_tokens=True)
            if any(s in text for s in self.stop):
                self.stopped[row] = True
                return True
            return False

        return callback


def length_groups(
    lengths: Sequence[int], max_new_tokens: int, batch_size: int, group_cost: float
) -> list[tuple[int, int]]:
    """Split prompts sorted by length into ``generate_batch`` calls of similar lengths.

    CTranslate2 prefills a batch's shortest length at once and feeds the rest of every longer
    prompt one token per decoding step, which costs about as much as generating it (here, 32
    prompts of 61-370 tokens ran 6.6x slower than 32 equal ones). The split minimizes, by dynamic
    programming, the sum over calls of ``group_cost * (spread + max_new_tokens)`` (each call's
    steps; ``group_cost`` is a step's fixed cost in units of one row's) plus the prompt tokens fed
    step by step; calls hold at most ``batch_size`` rows. Returns ``(start, stop)`` ranges.

    >>> length_groups([10, 11, 12, 200, 201], 16, 32, 3.0)
    [(0, 3), (3, 5)]
    >>> length_groups([10, 11, 30], 16, 2, 3.0)
    [(0, 2), (2, 3)]
    """
    n = len(lengths)
    sums = [0]
    for length in lengths:
        sums.append(sums[-1] + length)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for stop in range(1, n + 1):
        for start in range(max(0, stop - batch_size), stop):
            fed = sums[stop] - sums[start] - (stop - start) * lengths[start]
            cost = best[start] + group_cost * (lengths[stop - 1] - lengths[start] + max_new_tokens) + fed
            if cost < best[stop]:
                best[stop], cut[stop] = cost, start
    ranges = []
    stop = n
    while stop > 0:
        ranges.append((cut[stop], stop))
        stop = cut[stop]
    return ranges[::-1]


def _eos_ids(model_dir: Path, tokenizer: Any) -> list[int]:
    """End-of-sequence ids: the tokenizer's and the source model's ``generation_config.json``."""
    ids: set[int] = set()
    values: list[Any] = [tokenizer.eos_token_id]
    path = model_dir / "generation_config.json"
    if path.exists():
        values.append(json.loads(path.read_text()).get("eos_token_id"))
    for value in values:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if not ids:
        raise BackendError("the tokenizer has no eos_token_id; set tokenizer.eos_token before generating")
    return sorted(ids)
