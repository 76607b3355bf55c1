"""The one text space used for every observation and action.

gymnasium's :class:`~gymnasium.spaces.Text` checks each character against a charset (alphanumeric
by default), which real model output fails. :class:`ConversationText` accepts any Python ``str``
within its length bounds, and samples short strings of mixed unicode that sometimes carry answer
tags, so PettingZoo's random-action tests exercise the termination rules too.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium.spaces import Text

__all__ = ["ACTION_MAX_LENGTH", "OBSERVATION_MAX_LENGTH", "ConversationText", "TextObservation"]

ACTION_MAX_LENGTH = 400_000
"""Characters in one utterance (far above the 2000-token turn cap)."""
OBSERVATION_MAX_LENGTH = 8_000_000
"""Characters in one rendered observation (prompt plus every turn)."""

_SAMPLE_ALPHABET = (
    string.ascii_letters
    + string.digits
    + " .,;:!?-_()[]{}\n"
    + "éüßçñøåæœ"
    + "中文日本語한국어"
    + "αβγδ∑∫√π"
    + "😀🚀✓"
)
_SAMPLE_SNIPPETS = ("<A>", "</A>", "<A>yes</A>", "<A>42</A>", "\\boxed{", "}", "\\boxed{7}", "Alice:", "Bob:")


class ConversationText(Text):
    """A :class:`gymnasium.spaces.Text` that accepts any unicode string of bounded length."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length=max_length, min_length=min_length, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        """Any ``str`` whose length lies in ``[min_length, max_length]``."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A short random string (0-60 characters), sometimes with answer tags or name tags."""
        rng = self.np_random
        length = int(rng.integers(self.min_length, min(self.max_length, 60) + 1))
        chars = [_SAMPLE_ALPHABET[i] for i in rng.integers(0, len(_SAMPLE_ALPHABET), size=length)]
        if length and rng.random() < 0.5:
            pos = int(rng.integers(0, length))
            chars.insert(pos, _SAMPLE_SNIPPETS[int(rng.integers(0, len(_SAMPLE_SNIPPETS)))])
        text = "".join(chars)
        return text[: self.max_length]

    def __repr__(self) -> str:
        return f"ConversationText(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConversationText) and other.max_length == self.max_length

    def __hash__(self) -> int:  # pragma: no cover - trivial
        return hash(("ConversationText", self.max_length))


class TextObservation(str):
    """A plain ``str`` that also carries the text space's ``dtype``.

    PettingZoo's ``api_test`` compares ``observation.dtype`` with the space's; Python strings have
    none. Everything else sees an ordinary string (JSON, slicing, ``==``).
    """

    __slots__ = ()
    dtype = np.dtype(str)
