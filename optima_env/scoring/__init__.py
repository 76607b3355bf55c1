"""Answer extraction and task metrics shared by the task plugins.

========================  ==================================================================
extraction                :func:`extract_tagged` (``<A>...</A>``), :func:`extract_boxed`,
                          :func:`extract_answer_phrase` (the tag, else ``Answer: x``)
MATH                      :func:`normalize_math_answer`, :func:`math_equal` (math_verify, hard
                          timeout in a worker process)
open QA (IE tasks)        :func:`normalize_answer`, :func:`f1` (SQuAD words, or tokenizer
                          tokens as in the Optima code), :func:`exact_match`
GSM8K                     :func:`extract_gsm8k_gold`, :func:`gsm8k_equal`
multiple choice           :func:`choice_match` (ARC-Challenge, MMLU)
candidates                :func:`names_only` (names the gold and no rival: synth-v1)
the reference code        :func:`parse_tagged_answer`, :func:`parse_boxed_answer`,
                          :func:`normalize_final_answer`, :func:`reference_exact_match` (the
                          parsers and exact match the ``code`` scorers use, reproduced)
self-consistency          :func:`cluster_answers`, :func:`majority_vote`
========================  ==================================================================

Scorers raise :class:`~optima_env.errors.ScoringError` for arguments of the wrong type, and never
raise on arbitrary answer text: every score lies in [0, 1]. ``None`` as a prediction means no
answer was given and scores 0 (False). Nothing here imports torch or transformers, and no input
is ever evaluated as code.
"""

from __future__ import annotations

from optima_env.scoring.candidates import named_candidates, names_only
from optima_env.scoring.choice import choice_match
from optima_env.scoring.consistency import cluster_answers, majority_vote
from optima_env.scoring.extract import extract_answer_phrase, extract_boxed, extract_tagged
from optima_env.scoring.gsm8k import extract_gsm8k_gold, gsm8k_equal
from optima_env.scoring.math_norm import normalize_math_answer
from optima_env.scoring.mathequiv import MAX_VERIFY_CHARS, math_equal
from optima_env.scoring.qa import Tokenizer, exact_match, f1, normalize_answer
from optima_env.scoring.reference import (
    normalize_final_answer,
    parse_boxed_answer,
    parse_tagged_answer,
    reference_exact_match,
)

__all__ = [
    "MAX_VERIFY_CHARS",
    "Tokenizer",
    "choice_match",
    "cluster_answers",
    "exact_match",
    "extract_answer_phrase",
    "extract_boxed",
    "extract_gsm8k_gold",
    "extract_tagged",
    "f1",
    "gsm8k_equal",
    "majority_vote",
    "math_equal",
    "named_candidates",
    "names_only",
    "normalize_answer",
    "normalize_final_answer",
    "normalize_math_answer",
    "parse_boxed_answer",
    "parse_tagged_answer",
    "reference_exact_match",
]
