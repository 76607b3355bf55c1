"""Policies: a batch of chat prompts in, a batch of utterances out.

:class:`ChatPolicy` is the one-method interface every generation backend implements
(transformers in :mod:`optima_env.backends.hf`; vLLM and OpenAI-compatible servers build on the
same shape). :class:`ScriptedPolicy` is the shipped fake for tests: a function from a request to
a reply, no model involved.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from optima_env.errors import TaskContractError

__all__ = ["ChatPolicy", "GenerationRequest", "SamplingParams", "ScriptedPolicy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How to sample one batch.

    ``temperature == 0`` means greedy decoding.
    """

    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise TaskContractError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise TaskContractError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise TaskContractError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationRequest:
    """One prompt: chat messages, and the prefix the reply is forced to start with.

    The returned utterance includes ``prefix`` (e.g. ``"Alice:"``) followed by the continuation.
    """

    messages: Sequence[Mapping[str, str]]
    prefix: str = ""
    agent: str = ""
    key: tuple[object, ...] = field(default=())
    """Opaque identity of the request (e.g. (job, turn)); backends may use it to derive seeds."""


@runtime_checkable
class ChatPolicy(Protocol):
    """Anything that turns a batch of requests into a batch of utterances (same order)."""

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        """One utterance per request, each starting with the request's ``prefix``."""
        ...


class ScriptedPolicy:
    """A policy that answers with a Python function: ``reply(request) -> str``.

    The prefix is added when the reply does not start with it, as a real backend does.

    >>> policy = ScriptedPolicy(lambda r: "<A>Paris</A>")
    >>> policy.generate([GenerationRequest(messages=[], prefix="Bob:")], SamplingParams())
    ['Bob: <A>Paris</A>']
    """

    def __init__(self, reply: Callable[[GenerationRequest], str]) -> None:
        self.reply = reply
        self.calls: list[int] = []
        """Batch sizes of each ``generate`` call (for tests of batching)."""

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        self.calls.append(len(requests))
        out = []
        for request in requests:
            text = self.reply(request)
            if not isinstance(text, str):
                raise TaskContractError(f"scripted reply must be a str, got {type(text).__name__}")
            if request.prefix and not text.startswith(request.prefix):
                text = f"{request.prefix} {text}"
            out.append(text)
        return out

    @classmethod
    def from_turns(cls, turns: Sequence[str]) -> ScriptedPolicy:
        """Reply with ``turns[k]`` at the k-th turn of a conversation (k = messages so far - 1)."""

        def reply(request: GenerationRequest) -> str:
            k = sum(1 for m in request.messages if m.get("role") != "system")
            if k >= len(turns):
                raise TaskContractError(f"scripted policy has {len(turns)} turns, asked for turn {k + 1}")
            return turns[k]

        return cls(reply)
