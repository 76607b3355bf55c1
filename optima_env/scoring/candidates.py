"""A form-robust answer metric for tasks that know their candidate answers.

:func:`names_only` gives full credit to an answer that names the gold entity and no other
candidate of the instance, however it is worded ("Kariville", "The answer is Kariville.", "Zanvor
Labs is headquartered in Kariville"), and none to an answer that lists several candidates. F1
gives partial credit to a sentence around the right name, so an untrained model that answers in
sentences scores low on F1 for its form alone; this metric separates knowing the answer from
writing it bare.
"""

from __future__ import annotations

from collections.abc import Sequence

from optima_env.errors import ScoringError
from optima_env.scoring._validate import check_golds, check_optional_str
from optima_env.scoring.qa import normalize_answer

__all__ = ["named_candidates", "names_only"]


def _padded(text: str) -> str:
    return f" {normalize_answer(text)} "


def named_candidates(prediction: str, candidates: Sequence[str]) -> list[str]:
    """The candidates that ``prediction`` names, as whole words after SQuAD normalization.

    >>> named_candidates("Bob: Zanvor Labs is in Kariville.", ["Kariville", "Kari", "Melford"])
    ['Kariville']
    """
    text = _padded(prediction)
    return [c for c in candidates if normalize_answer(c) and _padded(c) in text]


def names_only(prediction: str | None, gold: str | Sequence[str], candidates: Sequence[str]) -> float:
    """1.0 when ``prediction`` names a gold alias and no candidate that is not gold, else 0.0.

    Args:
        prediction: the final answer; ``None`` (no answer) scores 0.
        gold: the gold answer or its aliases.
        candidates: every entity of the answer's kind in the instance (the gold among them or not).

    Raises:
        ScoringError: for arguments of the wrong type or an empty candidate list.

    >>> names_only("The city is Kariville.", "Kariville", ["Kariville", "Melford"])
    1.0
    >>> names_only("Kariville or Melford", "Kariville", ["Kariville", "Melford"])
    0.0
    >>> names_only("Karivillea", "Kariville", ["Kariville", "Melford"])
    0.0
    """
    prediction = check_optional_str("names_only", "prediction", prediction)
    golds = check_golds("names_only", gold)
    if isinstance(candidates, str) or not isinstance(candidates, Sequence) or not candidates:
        raise ScoringError(
            f"names_only: expected a non-empty list of candidate names, got {candidates!r}; pass every "
            "entity of the answer's kind in the instance"
        )
    if prediction is None:
        return 0.0
    gold_names = {normalize_answer(g) for g in golds}
    named = {normalize_answer(c) for c in named_candidates(prediction, [*candidates, *golds])}
    return float(bool(named & gold_names) and not (named - gold_names))
