"""Argument checks shared by the scorers: bad *types* raise, they are never scored 0."""

from __future__ import annotations

from collections.abc import Sequence

from optima_env.errors import ScoringError

__all__ = ["check_golds", "check_optional_str", "check_str"]


def _got(value: object) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def check_str(where: str, name: str, value: object) -> str:
    """Return ``value`` if it is a ``str``, else raise :class:`ScoringError`.

    >>> check_str("f1", "gold", "Paris")
    'Paris'
    """
    if not isinstance(value, str):
        raise ScoringError(
            f"{where}: expected {name} to be a str, got {_got(value)}; "
            f"pass the answer as text (e.g. str(value))"
        )
    return value


def check_optional_str(where: str, name: str, value: object) -> str | None:
    """Like :func:`check_str` but also accept ``None`` (no answer was given)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ScoringError(
            f"{where}: expected {name} to be a str or None, got {_got(value)}; "
            f"pass the extracted answer text, or None when no answer was given"
        )
    return value


def check_golds(where: str, gold: object) -> tuple[str, ...]:
    """Return the gold answer(s) as a non-empty tuple of strings.

    ``gold`` is one string or a sequence of accepted aliases.

    >>> check_golds("f1", "Paris")
    ('Paris',)
    >>> check_golds("f1", ["Paris", "City of Light"])
    ('Paris', 'City of Light')
    """
    if isinstance(gold, str):
        return (gold,)
    if not isinstance(gold, Sequence) or isinstance(gold, (bytes, bytearray)):
        raise ScoringError(
            f"{where}: expected gold to be a str or a sequence of str aliases, got {_got(gold)}; "
            f"pass the gold answer text or a list/tuple of accepted answers"
        )
    golds = tuple(gold)
    if not golds:
        raise ScoringError(
            f"{where}: expected at least one gold answer, got an empty {type(gold).__name__}; "
            f"check the dataset row (every sample needs a gold answer)"
        )
    for i, alias in enumerate(golds):
        if not isinstance(alias, str):
            raise ScoringError(
                f"{where}: expected every gold alias to be a str, got {_got(alias)} at index {i}; "
                f"convert the aliases to text"
            )
    return golds
