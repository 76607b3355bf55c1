"""How a task scores with the policy's tokenizer, and how reports name its scorer (spec §2.5).

The reference code scores information exchange by F1 over the policy tokenizer's tokens
(``cal_f1_score``), so the score of an answer depends on a tokenizer the task does not own. The env
has it (the ``tokenizer`` it counts tokens with) and scores through :func:`score_with_tokenizer`,
which calls a task's ``score_with(answer, sample, tokenizer=...)`` when the task has one and its
plain ``score(answer, sample)`` otherwise. :func:`scorer_name` is what reports and episode records
say produced a number (``episode.metadata["scorer"]``).

:class:`TokenF1Scoring` is the information-exchange implementation: ``f1="tokens"`` (default,
the reference) uses the task's own ``f1_tokenizer`` if it was given one, else the env's tokenizer;
with no tokenizer at all (a scripted policy and no ``tokenizer=``) it falls back to the SQuAD F1,
its scorer name says so, and the first such score of the process logs one warning that the number
is not the reference's metric ("The Eiffel Tower" vs "Eiffel Tower": 1.0 in SQuAD words, 0.667 in
Llama-3 tokens). The embedded model's tokenizer is not the default instead: it would make scoring
need ``transformers``, and it is not the reference's Llama-3 tokenizer either, so it would
look like the reference's metric without being it. ``f1="squad"`` is the official HotpotQA/SQuAD
F1 everywhere, chosen, with no warning.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from optima_env.errors import TaskContractError
from optima_env.scoring import Tokenizer, f1
from optima_env.task import declared_metric
from optima_env.types import TaskSample

__all__ = ["F1_MODES", "TokenF1Scoring", "score_with_tokenizer", "scorer_name", "usable_tokenizer"]

F1_MODES = ("tokens", "squad")
logger = logging.getLogger(__name__)
_fallback_warned = False


def usable_tokenizer(tokenizer: Any) -> Tokenizer | None:
    """``tokenizer`` when it can ``tokenize`` (a token counter alone cannot), else ``None``."""
    return tokenizer if callable(getattr(tokenizer, "tokenize", None)) else None


def score_with_tokenizer(task: Any, answer: str | None, sample: TaskSample, tokenizer: Any = None) -> float:
    """The task's score of ``answer``, given the policy's tokenizer when the task takes one."""
    score_with = getattr(task, "score_with", None)
    if callable(score_with):
        return float(score_with(answer, sample, tokenizer=usable_tokenizer(tokenizer)))
    return float(task.score(answer, sample))


def scorer_name(task: Any, tokenizer: Any = None) -> str:
    """The name of the scorer that produces the task's scores with this tokenizer: the task's own
    ``scorer_name``, else the ``metric`` it declares, else its ``score`` method.

    >>> class Plain:
    ...     id = "my/task-v0"
    >>> class Declared(Plain):
    ...     metric = "exact match"
    >>> scorer_name(Plain()), scorer_name(Declared())
    ('my/task-v0.score', 'exact match')
    """
    named = getattr(task, "scorer_name", None)
    if callable(named):
        return str(named(usable_tokenizer(tokenizer)))
    return declared_metric(task) or f"{getattr(task, 'id', type(task).__name__)}.score"


class TokenF1Scoring:
    """Mixin: F1 against ``sample.answers`` (best alias), over tokenizer tokens or SQuAD words.

    Call :meth:`init_f1` from ``__init__``.
    """

    f1_mode: Literal["tokens", "squad"] = "tokens"
    f1_tokenizer: Tokenizer | None = None

    def init_f1(self, f1_mode: str, f1_tokenizer: Tokenizer | None) -> None:
        """Check and store the F1 switch (``tokens`` or ``squad``) and an optional own tokenizer."""
        if f1_mode not in F1_MODES:
            raise TaskContractError(
                f"f1 must be one of {F1_MODES} ('tokens': the reference's tokenizer-token F1, "
                f"'squad': the official SQuAD/HotpotQA F1), got {f1_mode!r}"
            )
        if f1_tokenizer is not None and usable_tokenizer(f1_tokenizer) is None:
            raise TaskContractError(
                "f1_tokenizer must have a callable .tokenize(str) -> list[str], got "
                f"{type(f1_tokenizer).__name__}; pass e.g. the policy's transformers tokenizer"
            )
        self.f1_mode = f1_mode  # type: ignore[assignment]
        self.f1_tokenizer = f1_tokenizer

    def _f1_tokenizer(self, tokenizer: Tokenizer | None) -> Tokenizer | None:
        return (self.f1_tokenizer or tokenizer) if self.f1_mode == "tokens" else None

    def score(self, answer: str | None, sample: TaskSample) -> float:
        return self.score_with(answer, sample)

    def score_with(
        self, answer: str | None, sample: TaskSample, *, tokenizer: Tokenizer | None = None
    ) -> float:
        """The score with the policy's tokenizer (used by ``f1="tokens"`` when the task has none)."""
        chosen = self._f1_tokenizer(tokenizer)
        if chosen is None and self.f1_mode == "tokens":
            self._warn_squad_fallback()
        return f1(answer, sample.answers, tokenizer=chosen)

    def _warn_squad_fallback(self) -> None:
        """Say once per process that a ``tokens`` F1 without a tokenizer is not the reference's."""
        global _fallback_warned
        if _fallback_warned:
            return
        _fallback_warned = True
        logger.warning(
            "%s: F1 is scored over SQuAD words because no tokenizer was given, which is not the "
            "reference's metric (F1 over the policy tokenizer's tokens, spec §13.15); pass tokenizer= "
            "to the env (or f1_tokenizer= to the task) for the reference's F1, or f1='squad' to choose "
            "SQuAD F1 (scorer 'f1-squad (no tokenizer)' marks these scores)",
            getattr(self, "id", type(self).__name__),
        )

    def scorer_name(self, tokenizer: Tokenizer | None = None) -> str:
        """``f1-tokens`` (the reference's ``cal_f1_score``), ``f1-squad``, or the fallback."""
        if self.f1_mode == "squad":
            return "f1-squad"
        return "f1-tokens" if self._f1_tokenizer(tokenizer) is not None else "f1-squad (no tokenizer)"
