"""Token counting: #Tok of a trajectory is the sum over turns of the policy tokenizer's count.

As in the reference code (spec §2.4), a turn's count is ``len(tokenizer.tokenize(text))`` of the
turn text with its ``"Name:"`` prefix and without special tokens; system prompts are not counted.
Without a tokenizer, :class:`RegexTokenCounter` approximates it in a way long words cannot game,
and the env also caps a turn's characters at :data:`MAX_CHARS_PER_TOKEN` per token of its cap.
"""

from __future__ import annotations

import math
import re
from typing import Any, Protocol, runtime_checkable

from optima_env.errors import TaskContractError

__all__ = [
    "MAX_CHARS_PER_TOKEN",
    "RegexTokenCounter",
    "TokenCounter",
    "TokenizerCounter",
    "as_token_counter",
]

MAX_CHARS_PER_TOKEN = 16
"""Characters per token that real tokenizers stay well under on any text (about 4 on English).

The env treats a turn longer than ``MAX_CHARS_PER_TOKEN * turn_token_cap`` characters as
``large`` whatever its counter says, so a counter that undercounts (a custom one, or a tokenizer
with long merges) cannot carry a huge turn past the cap."""


@runtime_checkable
class TokenCounter(Protocol):
    """Anything that counts the tokens of a text."""

    def count(self, text: str) -> int:
        """The number of tokens in ``text``."""
        ...


class TokenizerCounter:
    """Counts with a Hugging Face tokenizer (or anything with ``tokenize(str) -> list``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def count(self, text: str) -> int:
        return len(self.tokenizer.tokenize(text)) if text else 0

    def __repr__(self) -> str:
        return f"TokenizerCounter({type(self.tokenizer).__name__})"


class RegexTokenCounter:
    """A model-free approximation of a BPE tokenizer's count.

    Every punctuation mark or symbol (anything that is neither a word character nor whitespace)
    is one token, and a run of word characters (a word or number) is one token per
    :attr:`bytes_per_piece` UTF-8 bytes, rounded up: a short English word is 1 token, a
    200,000-character word 33,334 (not 1), a CJK character about half a token. Whitespace is
    free. Used only when no tokenizer is given (scripted policies, random-action tests); every run
    that plays a model passes the model's tokenizer instead.

    >>> RegexTokenCounter().count("Alice: <A>42</A>")
    10
    >>> RegexTokenCounter().count("x" * 60)
    10
    """

    bytes_per_piece = 6
    """UTF-8 bytes of a word per counted token (BPE vocabularies average about 4-5 per token)."""
    _TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)

    def count(self, text: str) -> int:
        size = self.bytes_per_piece  # a mark is one match of at most 4 bytes: one token
        return sum(
            math.ceil(len(m.group().encode("utf-8", "surrogatepass")) / size)
            for m in self._TOKEN.finditer(text)
        )

    def __repr__(self) -> str:
        return "RegexTokenCounter()"


def as_token_counter(obj: Any) -> TokenCounter:
    """Turn ``None``, a tokenizer or a counter into a :class:`TokenCounter`."""
    if obj is None:
        return RegexTokenCounter()
    if isinstance(obj, TokenCounter):
        return obj
    if callable(getattr(obj, "tokenize", None)):
        return TokenizerCounter(obj)
    raise TaskContractError(
        f"tokenizer must be a Hugging Face tokenizer (with .tokenize) or an object with "
        f".count(text) -> int, got {type(obj).__name__}; pass tokenizer=AutoTokenizer.from_pretrained(...)"
    )
