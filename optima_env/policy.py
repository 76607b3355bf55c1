"""Policies: a batch of chat prompts in, a batch of utterances out.

:class:`ChatPolicy` is the one-method interface every generation backend implements:
transformers (:mod:`optima_env.backends.hf`), vLLM's offline engine (:mod:`optima_env.backends.vllm`)
and OpenAI-compatible HTTP servers (:mod:`optima_env.backends.openai`). :class:`ScriptedPolicy` is
the shipped fake for tests: a function from a request to a reply, no model involved.

The contract every backend keeps:

* one reply per request, in the order of the requests, each starting with the request's
  ``prefix`` (the forced ``"Name:"``) followed by the model's continuation;
* ``SamplingParams.stop`` strings cut the continuation before the first one found (the stop
  string itself is dropped), whatever the backend's own stop semantics;
* with ``SamplingParams.seed`` set, each request is sampled from its own seed,
  :func:`request_seed` of ``(seed, request.key)``, where the backend allows it;
* a failure that persists after the backend's retries raises
  :class:`~optima_env.errors.BackendError`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from optima_env.errors import TaskContractError

__all__ = [
    "ChatPolicy",
    "GenerationRequest",
    "TurnEngine",
    "PerAgentPolicy",
    "SamplingParams",
    "ScriptedPolicy",
    "finish_reply",
    "request_seed",
    "speaker_stops",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How to sample one batch.

    ``temperature == 0`` means greedy decoding.
    """

    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    """Base seed; each request gets :func:`request_seed` of it and the request's key."""
    stop: tuple[str, ...] = ()
    """Stop strings: the continuation is cut before the first one (e.g. :func:`speaker_stops`)."""
    ignore_eos: bool = False
    """Generate exactly ``max_new_tokens`` tokens (end-of-sequence suppressed): for benchmarks."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise TaskContractError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise TaskContractError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise TaskContractError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise TaskContractError(
                f"stop must be a tuple of non-empty strings, got {self.stop!r}; e.g. stop=('Bob:',)"
            )

    @property
    def greedy(self) -> bool:
        """Whether this is greedy decoding (``temperature == 0``)."""
        return self.temperature == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationRequest:
    """One prompt: chat messages, and the prefix the reply is forced to start with.

    The returned utterance includes ``prefix`` (e.g. ``"Alice:"``) followed by the continuation.
    """

    messages: Sequence[Mapping[str, str]]
    prefix: str = ""
    agent: str = ""
    key: tuple[object, ...] = field(default=())
    """Opaque identity of the request (e.g. (job seed, turn)); backends derive per-request seeds from it."""
    session: tuple[object, ...] = field(default=())
    """Identity of the conversation the request belongs to (``()``: none). A backend with several
    replicas keeps one session's requests on one replica, so that its prefix cache serves the
    conversation's earlier turns; it moves a session only when its replica fails."""


@runtime_checkable
class ChatPolicy(Protocol):
    """Anything that turns a batch of requests into a batch of utterances (same order)."""

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        """One utterance per request, each starting with the request's ``prefix``."""
        ...


@runtime_checkable
class TurnEngine(Protocol):
    """A policy that takes requests one at a time and hands back each reply as soon as it is done.

    The rollout driver (:func:`optima_env.rollout.rollout`) uses it so that no conversation waits
    for another's turn: it submits a conversation's next turn the moment its last one returned,
    and the engine admits it into the next free slot of its running batch (continuous batching)
    instead of waiting for the batch's longest reply. A backend that can do this implements the
    three members below besides :meth:`ChatPolicy.generate`; any other :class:`ChatPolicy` is
    driven through :class:`optima_env.rollout.BatchTurns`, which answers everything submitted as
    one ``generate`` batch (the behaviour of a barrier per turn).

    The contract:

    * ``submit(ticket, request, sampling)`` queues one request under a caller-chosen ``ticket``
      (an int unique among the pending ones); it returns at once and does not generate;
    * ``poll()`` advances the engine (one or more decode steps, or waits on its servers) and
      returns the ``(ticket, reply)`` pairs that finished since the last call, in any order; it
      returns at least one pair whenever a request is pending (it blocks until one is done) and
      ``[]`` when nothing is;
    * replies keep every rule of :class:`ChatPolicy` (prefix, stop strings, per-request seeds from
      :func:`request_seed`, so a seeded request samples the same text as through ``generate``);
    * a failure raises :class:`~optima_env.errors.BackendError` from ``poll``; the requests still
      pending are then dropped by the engine (the driver resubmits what it replays);
    * ``capacity`` is how many requests the engine runs at once (its batch slots), ``None`` if it
      has no fixed bound; the driver sizes its concurrency from it.
    """

    @property
    def capacity(self) -> int | None:
        """Requests decoded at once (batch slots); ``None`` when unbounded (e.g. HTTP servers)."""
        ...

    def submit(self, ticket: int, request: GenerationRequest, sampling: SamplingParams) -> None:
        """Queue ``request`` under ``ticket``; no generation happens here."""
        ...

    def poll(self) -> list[tuple[int, str]]:
        """Advance; the ``(ticket, reply)`` pairs finished since the last call (>= 1 if any is pending)."""
        ...


def request_seed(seed: int, key: tuple[object, ...]) -> int:
    """The sampling seed of one request: a stable 31-bit function of the base seed and its key.

    It does not depend on which other requests share the batch, so a backend that seeds each
    request on its own samples the same text whatever the batch composition.

    >>> request_seed(0, (5, 1)) == request_seed(0, (5, 1)) != request_seed(1, (5, 1))
    True
    """
    return zlib.crc32(f"{seed}/{key!r}".encode()) & 0x7FFFFFFF


def speaker_stops(agents: Sequence[str]) -> tuple[str, ...]:
    """Stop strings that end a turn when the speaker starts writing any agent's ``"Name:"`` tag.

    A turn that contains another agent's tag (or its own twice) impersonates (spec §3); stopping
    there saves the tokens instead of penalizing them afterwards.

    >>> speaker_stops(["Alice", "Bob"])
    ('Alice:', 'Bob:')
    """
    return tuple(f"{a}:" for a in agents)


def finish_reply(prefix: str, continuation: str, stop: Sequence[str] = ()) -> str:
    """``prefix + continuation``, the continuation cut before the first stop string.

    >>> finish_reply("Alice:", " I know X. Bob: hi", ("Bob:",))
    'Alice: I know X. '
    """
    cut = len(continuation)
    for s in stop:
        at = continuation.find(s)
        if 0 <= at < cut:
            cut = at
    return prefix + continuation[:cut]


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
            prefix = request.prefix if text.startswith(request.prefix) else ""
            out.append(finish_reply(prefix, text[len(prefix) :], sampling.stop))
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


class PerAgentPolicy:
    """A different policy (model, LoRA adapter, backend) per agent role, as one :class:`ChatPolicy`.

    Each batch is split by ``request.agent``: every agent's requests go to its own policy in one
    call, and the replies come back in request order, so :func:`optima_env.rollout.rollout`
    batches exactly as with a single policy. Agents missing from ``policies`` use ``default``.

    Args:
        policies: agent name -> policy (e.g. ``{"Alice": trained, "Bob": frozen_base}``).
        default: the policy of every other agent (``None``: each agent must be listed).

    >>> alice = ScriptedPolicy(lambda r: "<A>1</A>")
    >>> bob = ScriptedPolicy(lambda r: "<A>2</A>")
    >>> both = PerAgentPolicy({"Alice": alice, "Bob": bob})
    >>> both.generate([GenerationRequest(messages=[], prefix=f"{a}:", agent=a) for a in ("Bob", "Alice")],
    ...               SamplingParams())
    ['Bob: <A>2</A>', 'Alice: <A>1</A>']
    """

    def __init__(self, policies: Mapping[str, ChatPolicy], default: ChatPolicy | None = None) -> None:
        if not policies and default is None:
            raise TaskContractError("PerAgentPolicy needs at least one policy (per agent, or a default)")
        self.policies = dict(policies)
        self.default = default

    @property
    def tokenizer(self) -> Any:
        """The tokenizer that counts turns: the default policy's, else the first listed one's."""
        for policy in (self.default, *self.policies.values()):
            if policy is not None and getattr(policy, "tokenizer", None) is not None:
                return policy.tokenizer
        return None

    def policy_for(self, agent: str) -> ChatPolicy:
        """The policy that speaks for ``agent``."""
        policy = self.policies.get(agent, self.default)
        if policy is None:
            raise TaskContractError(
                f"no policy for agent {agent!r}; PerAgentPolicy has {sorted(self.policies)} and no default: "
                "add it, or give a default policy"
            )
        return policy

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        groups: dict[int, tuple[ChatPolicy, list[int]]] = {}
        for i, request in enumerate(requests):
            policy = self.policy_for(request.agent)
            groups.setdefault(id(policy), (policy, []))[1].append(i)
        replies: list[str | None] = [None] * len(requests)
        for policy, positions in groups.values():
            out = policy.generate([requests[i] for i in positions], sampling)
            if len(out) != len(positions):
                raise TaskContractError(
                    f"a per-agent policy returned {len(out)} replies for {len(positions)} requests"
                )
            for i, reply in zip(positions, out):
                replies[i] = reply
        return [r for r in replies if r is not None]

    def close(self) -> None:
        """Close every policy that can be closed (vLLM engines)."""
        for policy in {id(p): p for p in (self.default, *self.policies.values()) if p is not None}.values():
            close = getattr(policy, "close", None)
            if callable(close):
                close()
