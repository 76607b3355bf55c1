"""Row converters for the debate datasets: GSM8K, MATH, ARC-Challenge, MMLU.

Questions are kept raw; the "choose your answer from [...]" suffixes of ARC and MMLU (spec §2.2)
are added by the task plugins. Gold answers are kept unnormalized (scorers normalize).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from optima_env.datasets.common import sample_id, str_list
from optima_env.datasets.files import RowRef
from optima_env.types import TaskSample

__all__ = [
    "arc_sample",
    "gsm8k_sample",
    "last_boxed_content",
    "math_sample",
    "mmlu_sample",
]

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed_content(text: str) -> str | None:
    r"""The content of the last balanced ``\boxed{...}`` or ``\fbox{...}`` in ``text``.

    Also reads the brace-less form ``\boxed 5`` (up to the next ``$``), which a few MATH reference
    solutions use. Returns ``None`` when there is no box or its braces never close.

    >>> last_boxed_content(r"so $x = \boxed{\frac{1}{2}}$ and \boxed{3}")
    '3'
    >>> last_boxed_content(r"\fbox{a{b}c}"), last_boxed_content("none")
    ('a{b}c', None)
    >>> last_boxed_content(r"unclosed \boxed{x") is None
    True
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    i = start + len(cmd)
    if text.startswith(" ", i):
        rest = text[i + 1 :]
        return rest.split("$", 1)[0].strip() or None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def gsm8k_sample(row: Mapping[str, Any], ref: RowRef, default_id: str) -> TaskSample:
    """A GSM8K row as a sample.

    Source schemas: HF ``gsm8k``/``main`` and the original JSONL: ``question``, ``answer`` (the
    worked solution ending in ``#### N``); the local copy adds ``id`` and ``final_answer``.

    Gold = ``final_answer`` when present, else the text after the last ``####`` of ``answer``,
    stripped, with thousands commas removed (``1,080`` -> ``1080``). ``metadata["solution"]`` = the
    full ``answer`` text.
    """
    question = ref.get(row, "question", str)
    solution = ref.get(row, "answer", str)
    final = row.get("final_answer")
    if final is not None:
        gold = ref.check(final, str, "final_answer").strip()
    else:
        if "####" not in solution:
            raise ref.error("no '#### <answer>' line in the solution", "answer")
        gold = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not gold:
        raise ref.error("the final answer is empty", "final_answer" if final else "answer")
    return TaskSample(
        id=sample_id(row, default_id), question=question, answers=(gold,), metadata={"solution": solution}
    )


def math_sample(row: Mapping[str, Any], ref: RowRef, default_id: str) -> TaskSample:
    """A MATH (or MATH-500) row as a sample.

    Source schemas: HF ``EleutherAI/hendrycks_math`` / the original tarball: ``problem``, ``level``
    (``"Level 3"``), ``type`` (subject, e.g. ``"Algebra"``), ``solution``. The local copy adds
    ``unique_id`` and ``answer``; MATH-500 rows have ``subject`` instead of ``type`` and an int
    ``level``.

    Gold = ``answer`` when present, else the content of the last ``\\boxed{}``/``\\fbox{}`` of
    ``solution`` (raw; normalization is the scorer's). ``metadata``: ``level``, ``subject``,
    ``solution``.
    """
    question = ref.get(row, "problem", str)
    solution = ref.get(row, "solution", str)
    answer = row.get("answer")
    if answer is not None:
        gold = ref.check(answer, str, "answer").strip()
    else:
        gold = last_boxed_content(solution)
        if gold is None:
            raise ref.error("no balanced \\boxed{...} in the solution to take the answer from", "solution")
        gold = gold.strip()
    subject = row.get("type") if row.get("type") is not None else row.get("subject")
    metadata = {"level": row.get("level"), "subject": subject, "solution": solution}
    return TaskSample(
        id=sample_id(row, default_id),
        question=question,
        answers=(gold,),
        metadata={k: v for k, v in metadata.items() if v is not None},
    )


def arc_sample(row: Mapping[str, Any], ref: RowRef, default_id: str) -> TaskSample:
    """An ARC-Challenge row as a sample.

    Source schemas: HF ``ai2_arc``/``ARC-Challenge`` and the local copy: ``id``, ``question`` (the
    stem), ``choices`` {``text``: [...], ``label``: [...]}, ``answerKey``. The original AI2 JSONL
    (``question`` {``stem``, ``choices``: [{``text``, ``label``}]}) is accepted too.

    ``options`` = the choice texts in order; ``answers`` = (the text of the choice whose label is
    ``answerKey``,); ``metadata``: ``labels``, ``answer_key``.

    Raises:
        DataError: ``answerKey`` is not one of the labels.
    """
    question = ref.get(row, "question", (str, dict))
    if isinstance(question, dict):  # original AI2 layout
        stem = ref.check(question.get("stem"), str, "question.stem")
        items = ref.check(question.get("choices"), list, "question.choices")
        texts, labels = [], []
        for i, item in enumerate(items):
            ref.check(item, dict, f"question.choices[{i}]")
            texts.append(ref.check(item.get("text"), str, f"question.choices[{i}].text"))
            labels.append(ref.check(item.get("label"), str, f"question.choices[{i}].label"))
        question = stem
    else:
        choices = ref.get(row, "choices", dict)
        texts = str_list(choices.get("text"), ref, "choices.text")
        labels = str_list(choices.get("label"), ref, "choices.label")
        if len(texts) != len(labels):
            raise ref.error(f"{len(texts)} texts but {len(labels)} labels", "choices")
    key = ref.get(row, "answerKey", str)
    if key not in labels:
        raise ref.error(f"{key!r} is not one of the choice labels {labels}", "answerKey")
    return TaskSample(
        id=sample_id(row, default_id),
        question=question,
        answers=(texts[labels.index(key)],),
        options=tuple(texts),
        metadata={"labels": list(labels), "answer_key": key},
    )


def mmlu_sample(row: Mapping[str, Any], ref: RowRef, default_id: str) -> TaskSample:
    """An MMLU row as a sample.

    Source schemas: HF ``cais/mmlu`` and the local copy: ``question``, ``choices`` (4 strings),
    ``answer`` (index 0-3), ``subject`` (empty for ``auxiliary_train``); the local copy adds ``id``,
    ``answer_letter`` and, for ``auxiliary_train``, ``source`` (the original CSV). Old HF exports of
    ``auxiliary_train`` nest the record under ``"train"``; that is unwrapped.

    ``options`` = ``choices``; ``answers`` = ``(choices[answer],)``; ``metadata``: ``subject``,
    ``answer_index`` and ``source`` when present.
    """
    if "question" not in row and isinstance(row.get("train"), dict):
        row = row["train"]
    question = ref.get(row, "question", str)
    choices = str_list(ref.get(row, "choices", list), ref, "choices")
    index = ref.get(row, "answer", int)
    if not 0 <= index < len(choices):
        raise ref.error(f"index {index} is outside the {len(choices)} choices", "answer")
    metadata: dict[str, Any] = {"subject": row.get("subject") or "", "answer_index": index}
    if row.get("source"):
        metadata["source"] = row["source"]
    return TaskSample(
        id=sample_id(row, default_id),
        question=question,
        answers=(choices[index],),
        options=tuple(choices),
        metadata=metadata,
    )
