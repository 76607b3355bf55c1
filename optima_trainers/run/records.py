"""DPO preference pairs, the records a tree stage hands its DPO stage.

A :class:`PreferencePair` is one DPO example cut from an MCTS turn tree (spec §6.4): the
conversation up to a node, as the agent who speaks next reads it, and two of that node's children,
the best (chosen) and the worst (rejected) by their back-propagated values. Pairs round-trip
through JSONL exactly: ``read_pairs`` after ``write_pairs`` gives equal records.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from optima_env.errors import DataError
from optima_env.io import read_jsonl, write_text_atomic
from optima_env.types import check_fields

__all__ = [
    "PAIR_REASONS",
    "PairCandidate",
    "PairDetail",
    "PairSide",
    "PreferencePair",
    "read_pairs",
    "write_pairs",
]

_ROLES = frozenset({"system", "user", "assistant"})


@dataclass(frozen=True, slots=True, kw_only=True)
class PreferencePair:
    """One DPO example: a shared conversation prefix and a better and a worse next turn."""

    prompt: tuple[Mapping[str, str], ...]
    """Chat messages: the speaking agent's system prompt, then every turn on the path so far."""
    chosen: str
    """The max-value child's turn text (``"Name: ..."``)."""
    rejected: str
    """The min-value child's turn text."""
    chosen_value: float
    rejected_value: float
    task_id: str
    sample_id: str
    """The instance the tree was grown for (one tree per instance and iteration)."""
    instance_index: int
    """Position of that instance in its split."""
    depth: int
    """Turns before the chosen/rejected turn (0: the pair is about the first turn)."""
    agent: str
    """The agent who speaks the chosen/rejected turn."""
    chosen_task: float | None = None
    """The chosen side's task credit (the mean task term of the trajectories through it), carried
    only where ``dpo.rpo_scope="credited"`` needs it: ``None`` otherwise, and then not written, so
    that a stage's ``pairs.jsonl`` keeps the reference's fields."""

    def __post_init__(self) -> None:
        for message in self.prompt:
            if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
                raise DataError(
                    "prompt messages must be {'role': system|user|assistant, 'content': str}, "
                    f"got {message!r}"
                )
            if not isinstance(message.get("content"), str):
                raise DataError(f"a prompt message's content must be a str, got {message!r}")
        for name in ("chosen_value", "rejected_value"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or math.isnan(value):
                raise DataError(f"{name} must be a number, got {value!r}")

    @property
    def margin(self) -> float:
        """``chosen_value - rejected_value``."""
        return self.chosen_value - self.rejected_value

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "prompt": [dict(m) for m in self.prompt],
            "chosen": self.chosen,
            "rejected": self.rejected,
            "chosen_value": self.chosen_value,
            "rejected_value": self.rejected_value,
            "task_id": self.task_id,
            "sample_id": self.sample_id,
            "instance_index": self.instance_index,
            "depth": self.depth,
            "agent": self.agent,
        } | ({} if self.chosen_task is None else {"chosen_task": self.chosen_task})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreferencePair:
        """Rebuild a pair from :meth:`to_dict` output; raises :class:`DataError` on bad input."""
        if not isinstance(data, Mapping):
            raise DataError(f"a preference pair must be a JSON object, got {type(data).__name__}")
        check_fields(cls, data)
        try:
            return cls(
                prompt=tuple({"role": m["role"], "content": m["content"]} for m in data["prompt"]),
                chosen=data["chosen"],
                rejected=data["rejected"],
                chosen_value=float(data["chosen_value"]),
                rejected_value=float(data["rejected_value"]),
                task_id=data["task_id"],
                sample_id=data["sample_id"],
                instance_index=int(data["instance_index"]),
                depth=int(data["depth"]),
                agent=data["agent"],
                chosen_task=None if data.get("chosen_task") is None else float(data["chosen_task"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(
                f"not a valid preference pair: {exc!r}; expected the keys {sorted(cls.__slots__)}, "
                f"got {sorted(data)}"
            ) from exc


PAIR_REASONS = ("visits", "theta_filter", "theta_diff", "capped", "depth_cut", "task_credit")
"""Why a candidate pair is dropped (:meth:`optima_trainers.tree.nodes.Tree.pair_candidates`): a side
with fewer than ``tree.min_pair_visits`` visits; the chosen value not above θ_filter; the gap not
above θ_diff; the chosen turn ran to the generation cap, or every trajectory through the chosen
side was cut at the depth limit (both with ``sft.train_capped_turns=False``); the chosen side's
task credit not above the rejected side's (``tree.pair_task_credit``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PairSide:
    """One side of a candidate pair: a child node as the back-propagation left it."""

    node: int
    """The node's id in its tree."""
    text: str
    value: float
    """The mean reward of the trajectories through the node."""
    visits: int
    task: float
    """Task credit: the mean task term of those trajectories."""
    token: float | None
    """The mean token term (``None``: no trajectory came with its reward breakdown)."""
    readability: float | None
    """The mean readability term (``None`` as :attr:`token`)."""
    capped: bool
    """The turn ran to the generation cap."""
    depth_cuts: int
    """Trajectories through the node cut at the depth limit."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PairSide:
        """Rebuild from :meth:`to_dict` output; raises :class:`DataError` on bad input."""
        check_fields(cls, data)
        return cls(**{name: data[name] for name in cls.__slots__})


@dataclass(frozen=True, slots=True, kw_only=True)
class PairCandidate:
    """A pair the tree's pair rule proposes, its two sides and why it is dropped (if it is)."""

    pair: PreferencePair
    chosen: PairSide
    rejected: PairSide
    reasons: tuple[str, ...]
    """The rules it fails (:data:`PAIR_REASONS`, in that order); empty: kept."""

    @property
    def kept(self) -> bool:
        """No rule drops it."""
        return not self.reasons


@dataclass(frozen=True, slots=True, kw_only=True)
class PairDetail:
    """One line of a tree stage's ``pairs_detail.jsonl``: a candidate pair, kept or dropped."""

    chunk: int
    """The tree chunk (line of ``trees.jsonl``) it came from."""
    sample_id: str
    instance_index: int
    depth: int
    agent: str
    chosen: PairSide
    rejected: PairSide
    reasons: tuple[str, ...]
    """Why the pair rules drop it (:data:`PAIR_REASONS`); empty: kept by the rules."""
    selected: bool
    """In the stage's ``pairs.jsonl`` (kept, and among its tree's top ``tree.pair_fraction``)."""

    @classmethod
    def of(cls, candidate: PairCandidate, *, chunk: int, selected: bool) -> PairDetail:
        """The record of ``candidate``."""
        pair = candidate.pair
        return cls(
            chunk=chunk,
            sample_id=pair.sample_id,
            instance_index=pair.instance_index,
            depth=pair.depth,
            agent=pair.agent,
            chosen=candidate.chosen,
            rejected=candidate.rejected,
            reasons=candidate.reasons,
            selected=selected,
        )

    def gap(self) -> dict[str, float | None]:
        """Chosen minus rejected: the value (``total``) and the mean ``task``, ``token`` and
        ``readability`` terms (``None`` where a side has no reward breakdown)."""
        out: dict[str, float | None] = {"total": self.chosen.value - self.rejected.value}
        for name in ("task", "token", "readability"):
            a, b = getattr(self.chosen, name), getattr(self.rejected, name)
            out[name] = None if a is None or b is None else a - b
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, with the derived ``gap`` (read back, it is recomputed)."""
        out = {name: getattr(self, name) for name in self.__slots__}
        out |= {
            "chosen": self.chosen.to_dict(),
            "rejected": self.rejected.to_dict(),
            "reasons": list(self.reasons),
        }
        return out | {"gap": self.gap()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PairDetail:
        """Rebuild from :meth:`to_dict` output; raises :class:`DataError` on bad input."""
        if not isinstance(data, Mapping):
            raise DataError(f"a pair detail must be a JSON object, got {type(data).__name__}")
        data = {k: v for k, v in data.items() if k != "gap"}
        check_fields(cls, data)
        reasons = tuple(data["reasons"])
        unknown = [r for r in reasons if r not in PAIR_REASONS]
        if unknown:
            raise DataError(f"field 'reasons': unknown {unknown}; expected some of {list(PAIR_REASONS)}")
        return cls(**{**data, "chosen": PairSide.from_dict(data["chosen"]),
                      "rejected": PairSide.from_dict(data["rejected"]), "reasons": reasons})  # fmt: skip


def write_pairs(path: str | os.PathLike[str], pairs: Iterable[PreferencePair]) -> None:
    """Atomically write pairs as JSONL (replacing the file)."""
    write_text_atomic(path, "".join(json.dumps(p.to_dict(), ensure_ascii=False) + "\n" for p in pairs))


def read_pairs(path: str | os.PathLike[str]) -> list[PreferencePair]:
    """Read a JSONL file written by :func:`write_pairs`; a bad line raises :class:`DataError`."""
    return read_jsonl(path, PreferencePair.from_dict, torn_tail=False, fix="delete it to rebuild the pairs")
