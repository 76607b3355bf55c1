"""Policies for a run: a model through a backend, or the model-free scripted policy.

``--model scripted`` plays :class:`ReaderPolicy`, which needs no model: it follows the facts of its
own prompt to an answer, or agrees with its partner's, so the whole pipeline (scores, votes,
reports) sees non-trivial numbers without a model.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Any

from optima_env.errors import TaskContractError
from optima_env.policy import ChatPolicy, GenerationRequest, SamplingParams
from optima_env.scoring import extract_boxed, extract_tagged

__all__ = ["BACKENDS", "ReaderPolicy", "load_policy"]

BACKENDS = ("hf", "vllm", "openai")

_FACT_END = re.compile(r"((?:[A-Z][\w'-]*)(?:\s+[A-Z][\w'-]*)*)\.\s*$")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class ReaderPolicy:
    """A scripted :class:`~optima_env.policy.ChatPolicy` that reads its answer out of the prompt.

    Its "facts" are the prompt's lines that end in a capitalized name and a period (``X works for
    Shiwen Works.``). It follows a chain: from the question (and the latest answer in the
    conversation), a fact that mentions a name seen so far leads to that fact's final name, and so
    on. It proposes where the chain ends, or agrees with the latest answer when its own facts do
    not extend it; a prompt without facts gets a number of the question. With temperature > 0, a
    hash of the request key and seed sometimes picks a random fact's name instead, so samples
    differ. Replies carry the answer as ``<A>x</A>`` and ``\\boxed{x}``, so any task's extractor
    reads it. ``calls`` counts ``generate`` calls, ``requests`` the requests served.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.requests = 0

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        self.calls += 1
        self.requests += len(requests)
        return [self._reply(r, sampling) for r in requests]

    def _reply(self, request: GenerationRequest, sampling: SamplingParams) -> str:
        messages = list(request.messages)
        system = messages[0].get("content", "") if messages else ""
        latest = None
        for message in messages[1:]:
            content = message.get("content", "")
            latest = extract_tagged(content, "A") or extract_boxed(content) or latest
        facts = [(line, m.group(1)) for line in system.splitlines() if (m := _FACT_END.search(line.strip()))]
        question = next((line for line in system.splitlines() if line.startswith("Question:")), system)
        if not facts:
            numbers = _NUMBER.findall(question) or ["unknown"]
            answer = latest or numbers[-1]
        else:
            answer = _follow(facts, f"{question} {latest or ''}") or latest or facts[0][1]
            draw = zlib.crc32(f"{request.key}/{sampling.seed}".encode())
            if sampling.temperature > 0 and draw % 10 < 3:
                answer = facts[(draw // 10) % len(facts)][1]
        verb = "I agree." if answer == latest else "From my notes:"
        text = f"{verb} <A>{answer}</A> \\boxed{{{answer}}}"
        return f"{request.prefix} {text}" if request.prefix else text


def _names(text: str) -> set[str]:
    return {w for w in re.findall(r"[A-Z][\w'-]{3,}", text) if w not in {"Question", "What", "Which", "The"}}


def _follow(facts: list[tuple[str, str]], start: str) -> str | None:
    """Follow facts from the names in ``start``; the final name reached, or None."""
    seen, answer, used = _names(start), None, set()
    progress = True
    while progress:
        progress = False
        for i, (line, obj) in enumerate(facts):
            head = line[: line.rfind(obj)]
            if i not in used and _names(head) & seen and not _names(obj) <= seen:
                used.add(i)
                seen |= _names(obj)
                answer, progress = obj, True
                break
    return answer


def _verify_if_checkpoint(model: str) -> None:
    """A folder written by ``optima_trainers`` (it has a ``COMPLETE`` marker) is checked against its
    file list before loading; a truncated or altered checkpoint raises instead of being evaluated."""
    from pathlib import Path

    from optima_trainers.checkpoint import COMPLETE_MARKER, require_complete

    if (Path(model) / COMPLETE_MARKER).is_file():
        require_complete(model)


def load_policy(model: str, *, backend: str, batch_size: int) -> tuple[ChatPolicy, Any]:
    """``(policy, tokenizer)`` for ``model``; the tokenizer is ``None`` for the scripted policy.

    ``hf`` is transformers (:class:`~optima_env.backends.hf.TransformersPolicy`), ``vllm`` the vLLM
    offline engine with its defaults (:class:`~optima_env.backends.vllm.VLLMPolicy`).

    Raises:
        TaskContractError: an unknown backend, or ``openai`` (not wired yet).
        MissingDependencyError: the backend's package is not installed.
    """
    if model == "scripted":
        return ReaderPolicy(), None
    _verify_if_checkpoint(model)
    if backend not in BACKENDS:
        raise TaskContractError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "openai":
        raise TaskContractError(
            "--backend openai is not wired into benchmarks.run yet (it needs server URLs); use --backend hf "
            "or vllm, or build an optima_env.backends.openai.OpenAIChatPolicy in your own script"
        )
    if backend == "vllm":
        from optima_env.backends.vllm import VLLMPolicy

        policy = VLLMPolicy.from_pretrained(model)
        return policy, policy.tokenizer
    from optima_env.backends.hf import TransformersPolicy

    policy = TransformersPolicy.from_pretrained(model, batch_size=batch_size)
    return policy, policy.tokenizer
