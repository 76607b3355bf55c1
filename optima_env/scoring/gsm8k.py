"""GSM8K scoring: gold extraction after ``####`` and numeric answer comparison."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation, localcontext
from typing import Literal

from optima_env.errors import ScoringError
from optima_env.scoring._validate import check_optional_str, check_str
from optima_env.scoring.extract import extract_boxed
from optima_env.scoring.math_norm import normalize_math_answer

__all__ = ["extract_gsm8k_gold", "gsm8k_equal"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d)")
_TOLERANCE = Decimal("1e-6")
_MODES = ("numeric", "code", "code_eval")


def extract_gsm8k_gold(answer_text: str) -> str:
    """Return the final answer of a GSM8K solution: the text after the last ``####``.

    Args:
        answer_text: The dataset's ``answer`` field.

    Returns:
        The final answer, commas removed and stripped.

    Raises:
        ScoringError: If ``answer_text`` is not a str or has no ``####``.

    >>> extract_gsm8k_gold("3 + 4 = 7 apples\\n#### 1,007")
    '1007'
    """
    check_str("extract_gsm8k_gold", "answer_text", answer_text)
    if "####" not in answer_text:
        raise ScoringError(
            f"extract_gsm8k_gold: expected a GSM8K solution ending in '#### <answer>', got "
            f"{answer_text[-60:]!r}; pass the dataset's 'answer' field"
        )
    return answer_text.rsplit("####", 1)[1].replace(",", "").strip()


def gsm8k_equal(
    prediction: str | None,
    gold: str,
    *,
    mode: Literal["numeric", "code", "code_eval"] = "numeric",
) -> bool:
    """Compare a GSM8K prediction with the gold answer.

    The prediction is first reduced to the content of its last balanced ``\\boxed{}`` when it
    has one. ``gold`` may be the bare answer or a full solution with ``####``.

    Modes:

    * ``"numeric"`` (default): the first number in the prediction (commas between digits and
      ``$`` removed, so ``"$1,000.00"`` reads 1000) equals the gold number within 1e-6.
    * ``"code"``: the Optima training reward: ``normalize_math_answer`` of the prediction equals
      the gold string (both stripped and lowercased), e.g. ``"18.00"`` does not match ``"18"``.
    * ``"code_eval"``: the Optima evaluation script: the first number of the normalized
      prediction equals the gold string (string comparison).

    Args:
        prediction: The predicted answer or turn text; ``None`` (no answer) is False.
        gold: The gold answer.
        mode: Which comparison to use (see above).

    Returns:
        Whether the prediction is correct.

    Raises:
        ScoringError: On wrong argument types, an unknown ``mode``, or a gold without a number.

    >>> gsm8k_equal("$18.00", "18")
    True
    >>> gsm8k_equal(r"so the total is \\boxed{1,000}", "1000")
    True
    >>> gsm8k_equal("18.00", "18", mode="code")
    False
    """
    prediction = check_optional_str("gsm8k_equal", "prediction", prediction)
    check_str("gsm8k_equal", "gold", gold)
    if mode not in _MODES:
        raise ScoringError(
            f"gsm8k_equal: expected mode to be one of {_MODES}, got {mode!r}; "
            f"use 'numeric' for accuracy, 'code' or 'code_eval' to reproduce the reference code"
        )
    gold_text = extract_gsm8k_gold(gold) if "####" in gold else gold.strip()
    gold_number = _first_number(gold_text)
    if mode == "numeric" and gold_number is None:
        raise ScoringError(
            f"gsm8k_equal: expected the gold answer to contain a number, got {gold_text[:60]!r}; "
            f"check the dataset row, or use mode='code' for string comparison"
        )
    if prediction is None:
        return False
    boxed = extract_boxed(prediction)
    answer = prediction if boxed is None else boxed
    if mode == "code":
        return normalize_math_answer(answer).strip().lower() == gold_text.lower()
    if mode == "code_eval":
        found = _NUMBER.search(normalize_math_answer(answer))
        return found is not None and found.group() == gold_text.lower()
    predicted = _first_number(answer)
    return predicted is not None and _close(predicted, gold_number)


def _first_number(text: str) -> str | None:
    found = _NUMBER.search(_DIGIT_COMMA.sub("", text.replace("$", "")))
    return None if found is None else found.group()


def _close(a: str, b: str | None) -> bool:
    if b is None:
        return False
    try:
        x, y = Decimal(a), Decimal(b)
        if x == y:
            return True
        with localcontext() as ctx:
            ctx.prec = len(a) + len(b) + 10
            return abs(x - y) <= _TOLERANCE
    except (InvalidOperation, ValueError):
        return False
