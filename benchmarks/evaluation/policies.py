"""Policies for a run: a model through a backend, or the model-free scripted policy.

``--model scripted`` plays :class:`ReaderPolicy`, which needs no model: it follows the facts of its
own prompt to an answer, or agrees with its partner's, so the whole pipeline (scores, votes,
reports) sees non-trivial numbers without a model.
"""

from __future__ import annotations

import logging
import re
import zlib
from collections.abc import Sequence
from typing import Any

from optima_env.backends import loading as backends
from optima_env.errors import TaskContractError
from optima_env.policy import ChatPolicy, GenerationRequest, PerAgentPolicy, SamplingParams
from optima_env.scoring import extract_boxed, extract_tagged

__all__ = [
    "BACKENDS",
    "ReaderPolicy",
    "check_backend_flags",
    "check_model_name",
    "load_policy",
    "parse_agent_models",
    "token_counter_description",
]

logger = logging.getLogger("benchmarks.run")

BACKENDS = backends.BACKENDS

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
    file list before loading, and so is an exported adapter folder (against its ``manifest.json``,
    :func:`~optima_env.backends.peft_adapter.verify_manifest`); a truncated or altered checkpoint
    or adapter raises :class:`~optima_env.errors.DataError` instead of being evaluated."""
    from pathlib import Path

    from optima_env.backends.peft_adapter import is_adapter, verify_manifest
    from optima_trainers.run.checkpoint import COMPLETE_MARKER, require_complete

    if (Path(model) / COMPLETE_MARKER).is_file():
        require_complete(model)
    elif is_adapter(model):
        verify_manifest(model)


def check_model_name(model: str, backend: str) -> None:
    """Refuse a ``--model`` that is a URL: a server is reached with ``--backend openai --base-url``."""
    if model.startswith(("http://", "https://")):
        hint = "" if backend == "openai" else "--backend openai "
        raise TaskContractError(
            f"--model {model!r} is a URL, but --model names a model (a Hugging Face name, a folder, "
            f"'embedded' or 'scripted'); to play against an OpenAI-compatible server, pass {hint}"
            f"--base-url {model} --model <the model name the server serves>"
        )


def check_backend_flags(model: str, backend: str, *, base_urls: Sequence[str]) -> None:
    """Refuse ``--model``, ``--backend`` and ``--base-url`` values that cannot work together."""
    if model == "scripted":
        return
    check_model_name(model, backend)
    if base_urls and backend != "openai":
        raise TaskContractError(
            f"--base-url is for --backend openai (an OpenAI-compatible server), but the backend is "
            f"{backend!r}; add --backend openai, or drop --base-url"
        )
    if backend == "openai" and not base_urls:
        raise TaskContractError(
            "--backend openai needs the server: add --base-url URL (e.g. http://127.0.0.1:8000/v1; "
            "repeat it to rotate over several servers) and --model <the model name the server serves>"
        )


def token_counter_description(model: str, backend: str, tokenizer: str | None) -> str:
    """How a run's turns were counted, for its provenance."""
    if model == "scripted":
        return "regex approximation (scripted policy)"
    if backend == "openai" and tokenizer is None:
        return "regex approximation (--backend openai without --tokenizer)"
    name = f" {tokenizer}" if backend == "openai" else " of the model that played"
    return f"the tokenizer{name} (len(tokenizer.tokenize(turn text)))"


def _openai_policy(
    model: str, *, base_urls: Sequence[str], api_key_env: str | None, tokenizer: str | None, batch_size: int
) -> tuple[ChatPolicy, Any]:
    check_backend_flags(model, "openai", base_urls=base_urls)
    from optima_env.backends.openai import OpenAIChatPolicy

    policy = OpenAIChatPolicy(model, list(base_urls), api_key_env=api_key_env, max_concurrency=batch_size)
    if tokenizer is None:
        logger.warning(
            "--backend openai without --tokenizer: turns are counted with the regex approximation "
            "(optima_env.tokens.RegexTokenCounter); pass --tokenizer NAME_OR_FOLDER for exact counts"
        )
        return policy, None
    from optima_env.errors import require
    from optima_env.models import resolve_model_path

    transformers = require("transformers", "train")
    return policy, transformers.AutoTokenizer.from_pretrained(resolve_model_path(tokenizer))


def parse_agent_models(model: str) -> dict[str, str]:
    """``"Alice=embedded,Bob=runs/x/iter_02/checkpoint"`` as ``{"Alice": ..., "Bob": ...}``; ``{}``
    for a plain model name. A malformed spec raises :class:`TaskContractError` with an example.

    >>> parse_agent_models("Alice=embedded,Bob=ckpt"), parse_agent_models("embedded")
    ({'Alice': 'embedded', 'Bob': 'ckpt'}, {})
    """
    if "=" not in model or model.startswith(("http://", "https://")):
        return {}
    out: dict[str, str] = {}
    for item in model.split(","):
        agent, sep, name = item.partition("=")
        if not sep or not agent.strip() or not name.strip() or agent.strip() in out:
            raise TaskContractError(
                f"--model {model!r}: a model per agent is AGENT=MODEL[,AGENT=MODEL...] with each agent once "
                "(e.g. Alice=embedded,Bob=runs/isft/iter_02/checkpoint)"
            )
        out[agent.strip()] = name.strip()
    return out


def load_policy(
    model: str,
    *,
    backend: str,
    batch_size: int,
    base_urls: Sequence[str] = (),
    api_key_env: str | None = "OPENAI_API_KEY",
    tokenizer: str | None = None,
    **options: Any,
) -> tuple[ChatPolicy, Any]:
    """``(policy, tokenizer)`` for ``model``; the tokenizer is ``None`` for the scripted policy.

    ``hf`` is transformers (:class:`~optima_env.backends.hf.TransformersPolicy`), ``vllm`` the vLLM
    offline engine with its defaults (:class:`~optima_env.backends.vllm.VLLMPolicy`), ``openai``
    any OpenAI-compatible server at ``base_urls`` (:class:`~optima_env.backends.openai.OpenAIChatPolicy`,
    ``model`` being the name the server serves; the API key is read from ``$api_key_env``), whose
    turns are counted with ``tokenizer`` (a model name or folder; ``None``: the regex approximation).
    ``options`` go to the local backend's constructor (``vllm``: ``tensor_parallel_size``,
    ``data_parallel_size``, ``gpu_memory_utilization``).

    Raises:
        TaskContractError: an unknown backend, a URL as ``model``, or ``openai`` without ``base_urls``.
        MissingDependencyError: the backend's package is not installed.
    """
    if model == "scripted":
        return ReaderPolicy(), None
    per_agent = parse_agent_models(model)
    if per_agent:  # a different model per agent role: each loaded once, routed by the request's agent
        loaded: dict[str, tuple[ChatPolicy, Any]] = {}
        for name in dict.fromkeys(per_agent.values()):
            loaded[name] = load_policy(
                name, backend=backend, batch_size=batch_size, base_urls=base_urls,
                api_key_env=api_key_env, tokenizer=tokenizer, **options,
            )  # fmt: skip
        first = next(iter(per_agent.values()))
        policies = {agent: loaded[name][0] for agent, name in per_agent.items()}
        return PerAgentPolicy(policies), loaded[first][1]
    check_model_name(model, backend)
    if backend not in BACKENDS:
        raise TaskContractError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "openai":
        return _openai_policy(
            model, base_urls=base_urls, api_key_env=api_key_env, tokenizer=tokenizer, batch_size=batch_size
        )
    _verify_if_checkpoint(model)
    policy = backends.load_policy(model, backend=backend, batch_size=batch_size, **options)
    return policy, policy.tokenizer
