"""Open-answer QA metrics: SQuAD/HotpotQA normalization, token F1 and exact match.

Two F1 flavours:

* ``f1(pred, gold)`` is the official HotpotQA ``f1_score``: SQuAD normalization, whitespace
  tokens, and the rule that a "yes" / "no" / "noanswer" answer scores 0 unless both sides are
  the same such word.
* ``f1(pred, gold, tokenizer=tok)`` is what the Optima code trains and reports with
  (``reward/reward.py`` ``cal_f1_score``; spec 2.5 and 13.15): both strings are lowercased,
  stripped, then ``.strip("m=").strip("m = ")`` (a quirk of the reference code, kept so that
  rewards match), split with ``tok.tokenize`` (Llama-3 BPE in the paper) and compared as
  multisets. No SQuAD normalization and no yes/no rule.

Normalization is ASCII-punctuation only, as the official script: accents are kept, so
``"Zürich"`` and ``"zurich"`` share no token.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from optima_env.errors import ScoringError
from optima_env.scoring._validate import check_golds, check_optional_str

__all__ = ["Tokenizer", "exact_match", "f1", "normalize_answer"]

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_YES_NO = frozenset({"yes", "no", "noanswer"})


class Tokenizer(Protocol):
    """Anything with ``tokenize(text) -> list[str]``, e.g. a Hugging Face tokenizer."""

    def tokenize(self, text: str) -> list[str]:  # pragma: no cover - protocol
        """Split ``text`` into tokens."""
        ...


def normalize_answer(text: str) -> str:
    """Apply the official SQuAD/HotpotQA answer normalization.

    Lowercase, delete ASCII punctuation (``string.punctuation``), delete the articles a/an/the
    and collapse whitespace. Unicode letters are kept as they are (no accent folding).

    Args:
        text: An answer string.

    Returns:
        The normalized answer.

    Raises:
        ScoringError: If ``text`` is not a str.

    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    >>> normalize_answer("Zürich")
    'zürich'
    """
    if not isinstance(text, str):
        raise ScoringError(
            f"normalize_answer: expected a str, got {type(text).__name__}; pass the answer text"
        )
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def f1(
    prediction: str | None,
    gold: str | Sequence[str],
    *,
    tokenizer: Tokenizer | None = None,
) -> float:
    """Token-level F1 between a prediction and the gold answer (best over aliases).

    Args:
        prediction: The predicted answer; ``None`` means no answer was given, which scores 0.0.
        gold: The gold answer, or a sequence of accepted aliases (TriviaQA); the best F1 counts.
        tokenizer: If given, use the Optima code variant over ``tokenizer.tokenize`` tokens
            (see the module docstring) instead of SQuAD-normalized words.

    Returns:
        The F1 score in [0, 1].

    Raises:
        ScoringError: If an argument has the wrong type, ``gold`` is an empty sequence, or
            ``tokenizer`` has no callable ``tokenize``.

    >>> f1("The Eiffel Tower", "eiffel tower")
    1.0
    >>> round(f1("the big red dog", "red dog house"), 4)
    0.6667
    >>> f1("yes", "yes sir")
    0.0
    >>> f1(None, ["Paris", "Paris, France"])
    0.0
    """
    prediction = check_optional_str("f1", "prediction", prediction)
    golds = check_golds("f1", gold)
    if tokenizer is not None and not callable(getattr(tokenizer, "tokenize", None)):
        raise ScoringError(
            f"f1: expected tokenizer to have a callable .tokenize(str) -> list[str], got "
            f"{type(tokenizer).__name__}; pass e.g. a transformers tokenizer, or None for SQuAD F1"
        )
    if prediction is None:
        return 0.0
    if tokenizer is None:
        return max(_squad_f1(prediction, alias) for alias in golds)
    pred_tokens = _code_tokens(tokenizer, prediction)
    return max(_multiset_f1(pred_tokens, _code_tokens(tokenizer, alias)) for alias in golds)


def exact_match(prediction: str | None, gold: str | Sequence[str]) -> float:
    """Return 1.0 if the SQuAD-normalized prediction equals a normalized gold alias, else 0.0.

    Args:
        prediction: The predicted answer; ``None`` (no answer given) scores 0.0.
        gold: The gold answer, or a sequence of accepted aliases.

    Returns:
        1.0 or 0.0.

    Raises:
        ScoringError: If an argument has the wrong type or ``gold`` is an empty sequence.

    >>> exact_match("the Beatles.", ["Beatles", "The Fab Four"])
    1.0
    """
    prediction = check_optional_str("exact_match", "prediction", prediction)
    golds = check_golds("exact_match", gold)
    if prediction is None:
        return 0.0
    normalized = normalize_answer(prediction)
    return float(any(normalized == normalize_answer(alias) for alias in golds))


def _squad_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _YES_NO or ref in _YES_NO) and pred != ref:
        return 0.0
    return _multiset_f1(pred.split(), ref.split())


def _code_tokens(tokenizer: Tokenizer, text: str) -> list[str]:
    # Verbatim from reward.py cal_f1_score: strips the *characters* m, = and space at both ends.
    tokens = tokenizer.tokenize(text.lower().strip().strip("m=").strip("m = "))  # noqa: B005
    try:
        return [str(token) for token in tokens]
    except TypeError as exc:
        raise ScoringError(
            f"f1: expected tokenizer.tokenize to return a list of str, got "
            f"{type(tokens).__name__}; check the tokenizer object"
        ) from exc


def _multiset_f1(pred_tokens: Sequence[str], gold_tokens: Sequence[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)
