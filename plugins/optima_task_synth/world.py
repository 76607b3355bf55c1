"""The invented world both versions of the synthetic task draw from: relations, names, facts, and
the symbolic solver the tests use to check who can answer.

Names are made of random syllables, so no model can know them; instances are deterministic
functions of the random generator they are drawn with.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["KINDS", "RELATIONS", "Fact", "NameSource", "question", "solve"]

# (subject kind, object kind, fact template, question fragment)
RELATIONS = (
    ("person", "company", "{a} works for {b}.", "the company that {x} works for"),
    ("company", "city", "{a} is headquartered in {b}.", "the city where {x} is headquartered"),
    ("city", "country", "{a} is located in {b}.", "the country where {x} is located"),
    ("country", "language", "The official language of {a} is {b}.", "the official language of {x}"),
)
KINDS = ("person", "company", "city", "country", "language")
"""Entity kinds along a chain: relation ``r`` goes from ``KINDS[r]`` to ``KINDS[r + 1]``."""

_SYLLABLES = (
    "ka ri to mel zan vor ple dru shi na bex qua lo fen tis gar mu wen ost ryn jal "
    "hex cor dal pim vur sel tha bru ke ivo lan"
).split()
_SUFFIX = {
    "company": ("Labs", "Corp", "Works", "Systems", "Group"),
    "city": ("", "ville", "ford", "burg", "haven"),
    "country": ("ia", "land", "stan", "ora", "ica"),
    "language": ("ish", "ese", "ic", "an", "i"),
}


@dataclass(frozen=True, slots=True)
class Fact:
    """One relation instance: ``subject --relation--> obj``."""

    relation: int
    subject: str
    obj: str

    @property
    def text(self) -> str:
        return RELATIONS[self.relation][2].format(a=self.subject, b=self.obj)


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()


def _name(rng: random.Random, kind: str) -> str:
    if kind == "person":
        return f"{_word(rng, 2)} {_word(rng, 2)}"
    suffix = rng.choice(_SUFFIX[kind])
    base = _word(rng, 2)
    return f"{base} {suffix}" if kind == "company" else base + suffix


class NameSource:
    """Fresh names of one instance: never the same name twice, whatever the kind.

    ``strict`` also keeps every word of a new name (a company's suffix aside) from containing, or
    being contained in, a word given out before, so that a name is found in a text only where it
    was said: ``Karito`` is never part of ``Karitoville`` or of ``Karito Labs``.
    """

    def __init__(self, rng: random.Random, *, strict: bool = False) -> None:
        self.rng = rng
        self.strict = strict
        self._used: set[str] = set()
        self._words: set[str] = set()

    def fresh(self, kind: str) -> str:
        """A name of ``kind`` not given out before in this instance."""
        while True:
            name = _name(self.rng, kind)
            if name in self._used:
                continue
            words = _words(name, kind)
            if self.strict and any(w in u or u in w for w in words for u in self._words):
                continue
            self._used.add(name)
            self._words.update(words)
            return name


def _words(name: str, kind: str) -> set[str]:
    words = name.lower().split()
    return set(words[:-1] if kind == "company" else words)


def question(subject: str, hops: int) -> str:
    """The question that follows ``hops`` relations from ``subject``."""
    phrase = "{x}"
    for relation in range(hops - 1, -1, -1):
        phrase = phrase.format(x=RELATIONS[relation][3])
    fragment = phrase.format(x=subject)
    return f"What is {fragment}? (answer with the {KINDS[hops]}'s name)"


def solve(question_subject: str, facts: Iterable[Fact], hops: int) -> str | None:
    """Follow ``hops`` relations from ``question_subject`` through ``facts``.

    Returns the unique end entity, or ``None`` when a link is missing (or ambiguous).
    """
    by_key: dict[tuple[int, str], set[str]] = {}
    for fact in facts:
        by_key.setdefault((fact.relation, fact.subject), set()).add(fact.obj)
    entity = question_subject
    for relation in range(hops):
        objs = by_key.get((relation, entity), set())
        if len(objs) != 1:
            return None
        (entity,) = objs
    return entity
