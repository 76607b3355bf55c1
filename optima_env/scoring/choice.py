"""Multiple-choice scoring (ARC-Challenge, MMLU): map a free-form answer onto an option."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from optima_env.errors import ScoringError
from optima_env.scoring._validate import check_optional_str, check_str

__all__ = ["choice_match"]

_PUNCT_OR_SPACE = re.compile(r"[\s" + re.escape(string.punctuation) + r"]+")
_LABEL_FORMS = (
    # "B", "(B)", "[B]", "B.", "B)", "B:", optionally after "option"/"answer"/"choice"
    r"(?:(?:option|answer|choice)\s*(?:is\s*)?:?\s*)?[(\[]?\s*({label})\s*[)\].:]?",
    # "B) text", "B. text", "B: text", "(B) text"
    r"(?:\(\s*({label})\s*\)|({label})\s*[).:])\s+.*",
)


def choice_match(
    prediction: str | None,
    options: Sequence[str],
    gold: str,
    *,
    labels: Sequence[str] | None = None,
    strict: bool = False,
) -> bool:
    """Decide whether a multiple-choice answer picks the gold option.

    Tried in order, the first rule that resolves the prediction wins:

    1. exact match of the lowercased, stripped prediction with the gold text (the reference
       code's only rule; with ``strict=True`` nothing else is tried);
    2. the prediction equals an option's text up to case, punctuation and whitespace;
    3. the prediction names an option label: ``"B"``, ``"(B)"``, ``"B."``, ``"B) text"``,
       ``"Answer: B"``; labels are case-insensitive, ``A``, ``B``, ... by default.

    Option texts take precedence over labels, so with options ``["2", "4"]`` and numeric labels
    the prediction ``"2"`` means the option whose text is "2".

    Args:
        prediction: The extracted answer; ``None`` (no answer given) is False.
        options: The option texts in order.
        gold: The gold option's text.
        labels: The option labels, one per option (ARC sometimes uses ``"1"``-``"4"``).
        strict: Only apply rule 1, as the Optima code does.

    Returns:
        Whether the prediction selects an option whose text equals the gold text.

    Raises:
        ScoringError: On wrong argument types, no options, labels not matching the options,
            or a gold text that is not one of the options.

    >>> choice_match("(B)", ["red", "blue"], "blue")
    True
    >>> choice_match("  Blue. ", ["red", "blue"], "blue")
    True
    >>> choice_match("2", ["red", "blue"], "blue", labels=["1", "2"])
    True
    """
    prediction = check_optional_str("choice_match", "prediction", prediction)
    check_str("choice_match", "gold", gold)
    texts, names = _check_options(options, labels)
    gold_key = _loose(gold)
    if gold_key not in {_loose(text) for text in texts}:
        raise ScoringError(
            f"choice_match: expected gold to be the text of one option, got {gold[:60]!r} "
            f"(options: {[t[:30] for t in texts]}); pass the option text, not its label"
        )
    if prediction is None:
        return False
    if prediction.strip().lower() == gold.strip().lower():
        return True
    if strict:
        return False
    pred_key = _loose(prediction)
    for text in texts:
        if pred_key == _loose(text):
            return pred_key == gold_key
    index = _label_index(prediction, names)
    return index is not None and _loose(texts[index]) == gold_key


def _check_options(
    options: Sequence[str], labels: Sequence[str] | None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if isinstance(options, str) or not isinstance(options, Sequence) or not options:
        raise ScoringError(
            f"choice_match: expected options to be a non-empty sequence of str, got "
            f"{type(options).__name__}; pass the option texts in order"
        )
    texts = tuple(check_str("choice_match", "each option", text) for text in options)
    if labels is None:
        if len(texts) > 26:
            raise ScoringError(
                f"choice_match: default labels A-Z cover 26 options, got {len(texts)}; "
                f"pass labels= explicitly"
            )
        return texts, tuple(string.ascii_uppercase[: len(texts)])
    if isinstance(labels, str) or not isinstance(labels, Sequence) or len(labels) != len(texts):
        raise ScoringError(
            f"choice_match: expected one label per option ({len(texts)}), got {labels!r}; "
            f"pass e.g. labels=['1', '2', '3', '4']"
        )
    names = tuple(check_str("choice_match", "each label", name).strip() for name in labels)
    if any(not name for name in names):
        raise ScoringError(f"choice_match: expected non-empty labels, got {labels!r}")
    return texts, names


def _loose(text: str) -> str:
    return " ".join(_PUNCT_OR_SPACE.sub(" ", text.lower()).split())


def _label_index(prediction: str, names: tuple[str, ...]) -> int | None:
    alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    text = " ".join(prediction.split())  # single spaces keep the patterns linear-time
    for form in _LABEL_FORMS:
        pattern = re.compile(form.format(label=alternatives), re.IGNORECASE | re.DOTALL)
        found = pattern.fullmatch(text)
        if found:
            label = next(group for group in found.groups() if group is not None)
            lowered = [name.lower() for name in names]
            return lowered.index(label.lower())
    return None
