"""Token counting: #Tok of a trajectory is the sum over turns of the policy tokenizer's count.

As in the reference code (spec §2.4), a turn's count is ``len(tokenizer.tokenize(text))`` of the
turn text with its ``"Name:"`` prefix and without special tokens; system prompts are not counted.
"""

from __future__ import annotations

import re
from typing import Any, Protocol, runtime_checkable

from optima_env.errors import TaskContractError

__all__ = ["RegexTokenCounter", "TokenCounter", "TokenizerCounter", "as_token_counter"]


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
    """A model-free approximation: words, numbers and single punctuation marks are tokens.

    Used only when no tokenizer is given (scripted policies, random-action tests); every run that
    plays a model passes the model's tokenizer instead.

    >>> RegexTokenCounter().count("Alice: <A>42</A>")
    7
    """

    _TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)

    def count(self, text: str) -> int:
        return sum(1 for _ in self._TOKEN.finditer(text))

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
