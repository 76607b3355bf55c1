"""Prompt templates shared by task plugins (written from the paraphrase in spec §2.3).

Templates use :class:`string.Template` placeholders, as the reference code does:
``${name}``, ``${partner}``, ``${question}`` and ``${information}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from string import Template

__all__ = ["INFORMATION_EXCHANGE_PROMPT", "join_names", "render"]

INFORMATION_EXCHANGE_PROMPT = Template(
    """You are ${name}. You do not talk in natural language but in a very compact format, because you \
run on a small device where every extra token costs energy and too many may shut it down. Work with \
${partner} to answer the question below.

Question: ${question}

Your information:
${information}

Guidelines:
1. Your information is incomplete. Keep exchanging facts with ${partner} until you can answer.
2. When you know the answer, write it as <A>answer</A>. The conversation ends only when every agent \
has written the same answer this way.
3. Reason step by step.
4. Use only your information and what ${partner} tells you.
5. Your token budget is tiny: prefer structured formats, code or a shorthand of your own, drop \
anything unnecessary, but stay informative.
6. Begin your response with "${name}:"."""
)


def join_names(names: Sequence[str]) -> str:
    """``["Bob"]`` -> ``"Bob"``; ``["Bob", "Charlie"]`` -> ``"Bob and Charlie"``.

    >>> join_names(["Bob", "Charlie", "Dave"])
    'Bob, Charlie and Dave'
    """
    names = list(names)
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def render(template: Template, **values: str) -> str:
    """Fill every placeholder (a missing one raises ``KeyError``, never a silent gap)."""
    return template.substitute(**values)
