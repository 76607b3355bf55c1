"""Records that flow through optima: samples, views, turns, reward breakdowns and episodes.

All records are frozen, slotted, keyword-only dataclasses holding plain data (no live objects), so
an :class:`Episode` round-trips through JSON exactly: ``Episode.from_dict(json.loads(json.dumps(
episode.to_dict()))) == episode``. Change a record with :func:`dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optima_env.errors import DataError

__all__ = [
    "AgentView",
    "Episode",
    "Paragraph",
    "RewardBreakdown",
    "TaskSample",
    "Turn",
    "check_fields",
]

_record = dataclass(frozen=True, slots=True, kw_only=True)


@_record
class Paragraph:
    """One unit of evidence: a titled paragraph split into sentences (a snippet is one sentence)."""

    title: str
    sentences: tuple[str, ...]

    @property
    def text(self) -> str:
        """The sentences joined with single spaces."""
        return " ".join(s.strip() for s in self.sentences if s.strip())


@_record
class TaskSample:
    """One task instance, as loaded from a dataset or generated.

    ``answers`` holds the gold answer first and any accepted aliases after it. ``context`` and
    ``supporting_titles`` are used by information-exchange tasks to deal evidence between agents;
    ``options`` by multiple-choice tasks. ``metadata`` keeps task-specific extras (JSON values only).
    """

    id: str
    question: str
    answers: tuple[str, ...]
    context: tuple[Paragraph, ...] = ()
    supporting_titles: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def answer(self) -> str:
        """The canonical gold answer (the first of ``answers``)."""
        return self.answers[0]


@_record
class AgentView:
    """What one agent is told before the conversation starts."""

    agent: str
    system_prompt: str
    """The system prompt the agent plays with (format instruction included when one was drawn)."""
    base_system_prompt: str
    """The same prompt without the format instruction: what training examples use (spec §4)."""
    role: str = "peer"
    """``peer`` for information exchange; ``solver`` or ``critic`` in debate."""
    private: tuple[str, ...] = ()
    """The evidence units dealt to this agent (empty in debate)."""


@_record
class Turn:
    """One utterance. ``text`` includes the ``"Name:"`` prefix, as it is counted and shown."""

    index: int
    agent: str
    text: str
    num_tokens: int
    answer: str | None = None
    """The answer this turn carries (task-specific extraction), or ``None``."""


@_record
class RewardBreakdown:
    """The Optima reward of one trajectory, term by term (spec §3, Eq. 1).

    ``total == task + token + readability`` except when a penalty flag says otherwise
    (e.g. ``impersonation_sft`` subtracts 10).
    """

    task: float
    """The task score actually used (after, e.g., the MCTS impersonation rule)."""
    token: float
    """The token term as added: ``-lambda_token * num_tokens / normalizer``, or -1 by a special case."""
    readability: float
    """The readability term as added: ``lambda_loss / lm_loss``, or -1 / 0 by a special case."""
    total: float
    num_tokens: int
    normalizer: float
    lm_loss: float | None = None
    flags: tuple[str, ...] = ()
    """Names of the special cases that fired (see :class:`optima_env.reward.RewardConfig`)."""


@_record
class Episode:
    """The full record of one conversation, as trainers and benchmarks consume it."""

    task_id: str
    sample_id: str
    seed: int | None
    agents: tuple[str, ...]
    turns: tuple[Turn, ...]
    final_answer: str | None
    gold: tuple[str, ...]
    task_score: float
    terminated: bool
    """The agents settled on an answer (the same answer twice in a row)."""
    truncated: bool
    """The turn limit or the per-turn token cap ended the episode first."""
    end_reason: str
    """``agreement``, ``max_turns``, ``turn_too_long`` or ``context_full`` (the next prompt would
    not fit the model's context, ``ConversationEnv(max_prompt_tokens=...)``)."""
    num_tokens: int
    system_prompts: Mapping[str, str]
    base_system_prompts: Mapping[str, str]
    format_index: int | None = None
    lm_loss: float | None = None
    """Max over turns of the frozen base model's mean LM loss, when a readability scorer ran."""
    reward: RewardBreakdown | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    # -- serialization ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists)."""
        return _to_jsonable(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Episode:
        """Rebuild an episode from :meth:`to_dict` output.

        Raises :class:`DataError` naming the first bad field (``field 'turns[1].num_tokens':
        expected int, got str``) when a field is missing, unknown or of the wrong type.
        """
        if not isinstance(data, Mapping):
            raise DataError(f"an episode must be a JSON object, got {type(data).__name__}")
        check_fields(cls, data)
        for i, turn in enumerate(data["turns"]):
            check_fields(Turn, turn, prefix=f"turns[{i}].")
        reward = data.get("reward")
        if reward is not None:
            check_fields(RewardBreakdown, reward, prefix="reward.")
        return cls(
            **{
                **{k: v for k, v in data.items() if k not in {"turns", "reward"}},
                "agents": tuple(data["agents"]),
                "gold": tuple(data["gold"]),
                "turns": tuple(Turn(**t) for t in data["turns"]),
                "reward": None
                if reward is None
                else RewardBreakdown(**{**reward, "flags": tuple(reward.get("flags", ()))}),
            }
        )

    @property
    def answer_turns(self) -> tuple[Turn, ...]:
        """The turns that carry an answer."""
        return tuple(t for t in self.turns if t.answer is not None)


def check_fields(cls: type, data: Any, *, prefix: str = "") -> None:
    """Check that ``data`` (parsed JSON) has every required field of the dataclass ``cls``, no
    unknown one, and values of the annotated types (nested records are checked by the caller).

    Raises :class:`DataError` naming the field: ``field 'x': missing``, ``field 'x': expected
    int, got str`` or ``field 'x': unknown; expected the fields [...]``.

    >>> check_fields(Turn, {"index": 0, "agent": "Alice", "text": "Alice: hi", "num_tokens": "3"})
    Traceback (most recent call last):
    ...
    optima_env.errors.DataError: field 'num_tokens': expected int, got str ('3')
    """
    if not isinstance(data, Mapping):
        raise DataError(f"field '{prefix.rstrip('.') or cls.__name__}': expected an object, {_got(data)}")
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                has = sorted(data) if len(data) <= 12 else f"{len(data)} other fields"
                raise DataError(f"field '{prefix}{f.name}': missing; the record has {has}")
            continue
        if not _matches(data[f.name], hints[f.name]):
            raise DataError(
                f"field '{prefix}{f.name}': expected {_type_name(hints[f.name])}, {_got(data[f.name])}"
            )
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise DataError(f"field '{prefix}{unknown[0]}': unknown; expected the fields {sorted(hints)}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _matches(value: Any, hint: Any) -> bool:
    """Whether parsed JSON ``value`` fits ``hint`` (records nested in it are only checked as objects)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return isinstance(value, (list, tuple)) and all(_matches(v, item) for v in value)
    if origin is not None and issubclass(origin, Mapping):
        _, item = typing.get_args(hint)
        return isinstance(value, Mapping) and all(_matches(v, item) for v in value.values())
    if dataclasses.is_dataclass(hint):
        return isinstance(value, Mapping)
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _got(value: Any) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"got {type(value).__name__} ({shown})"


def _to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_jsonable(v) for v in value]
    return value
