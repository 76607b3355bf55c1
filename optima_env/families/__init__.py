"""The generic task families the paper's eight tasks are built from.

A task plugin subclasses one of these and sets its dataset, its answer check and its docs:

================================  ==============================================================
:class:`SupportingFactsTask`      information exchange, supporting paragraphs dealt in turn
                                  (HotpotQA, 2WikiMultihopQA)
:class:`ShuffledSnippetsTask`     information exchange, snippets shuffled and dealt (TriviaQA)
:class:`HalvesTask`               information exchange, the story in halves (CBT)
:class:`MathDebateTask`           solver/critic debate with ``\\boxed{}`` answers (GSM8K, MATH)
:class:`ChoiceDebateTask`         solver/critic debate on multiple choice (ARC-Challenge, MMLU)
================================  ==============================================================

All load their data lazily through :func:`optima_env.datasets.load_samples`
(:class:`DatasetTask`) and deal evidence with :mod:`optima_env.families.dealing`.
"""

from __future__ import annotations

from optima_env.families.base import DatasetTask, options_list
from optima_env.families.dealing import deal_halves, deal_shuffled, deal_supporting, paragraph_unit
from optima_env.families.debate import ChoiceDebateTask, DebateTask, MathDebateTask, extract_math_answer
from optima_env.families.information_exchange import (
    HalvesTask,
    InformationExchangeTask,
    ShuffledSnippetsTask,
    SupportingFactsTask,
)

__all__ = [
    "ChoiceDebateTask",
    "DatasetTask",
    "DebateTask",
    "HalvesTask",
    "InformationExchangeTask",
    "MathDebateTask",
    "ShuffledSnippetsTask",
    "SupportingFactsTask",
    "deal_halves",
    "deal_shuffled",
    "deal_supporting",
    "extract_math_answer",
    "options_list",
    "paragraph_unit",
]
