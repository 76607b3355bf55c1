"""Information exchange (spec §2.1, §2.3): every agent holds part of the evidence.

All agents get the same question and the same prompt
(:data:`~optima_env.prompts.INFORMATION_EXCHANGE_PROMPT`) with their own private information, the
units dealt to them joined with newlines (spec §13 item 10). With a format index, every agent's
prompt gets the same example block of :data:`~optima_env.prompts.FORMAT_EXAMPLES` (spec §4). The
answer is the last ``<A>...</A>`` of a turn as written (the reference parser does not strip it, so
the env's termination compares the unstripped strings), scored by F1 against the gold answer and
its aliases: by default over the policy tokenizer's tokens, as the reference (spec §2.5, §13 item
15; :mod:`optima_env.families.scoring`).

Three dealing schemes cover the paper's datasets (:mod:`optima_env.families.dealing`):

* :class:`SupportingFactsTask`: HotpotQA, 2WikiMultihopQA (supporting paragraphs dealt in turn,
  distractors at random), with the switches ``full_paragraphs`` and ``strict_split``;
* :class:`ShuffledSnippetsTask`: TriviaQA (snippets shuffled, dealt in turn);
* :class:`HalvesTask`: CBT (first half / second half of the story, question + options suffix).
"""

from __future__ import annotations

import abc
import random
from collections.abc import Mapping
from typing import Any, ClassVar

from optima_env.errors import TaskContractError
from optima_env.families.base import DatasetTask, options_list
from optima_env.families.dealing import deal_halves, deal_shuffled, deal_supporting
from optima_env.families.scoring import TokenF1Scoring
from optima_env.prompts import (
    FORMAT_EXAMPLES,
    INFORMATION_EXCHANGE_PROMPT,
    STYLES,
    join_names,
    render,
    with_format_block,
)
from optima_env.scoring import Tokenizer, extract_answer_phrase, extract_tagged
from optima_env.types import AgentView, TaskSample

__all__ = [
    "TAG_ANSWERS",
    "HalvesTask",
    "InformationExchangeTask",
    "ShuffledSnippetsTask",
    "SupportingFactsTask",
]

TAG_ANSWERS = ("code", "stripped")
"""How an ``<A>...</A>`` answer is taken: as written (the reference) or stripped."""


class InformationExchangeTask(TokenF1Scoring, DatasetTask):
    """Base of the information-exchange tasks; subclasses implement :meth:`deal`.

    Args:
        f1: ``"tokens"`` (default, the reference's ``cal_f1_score``): F1 over the tokens of
            ``f1_tokenizer``, else of the policy's tokenizer the env scores with (SQuAD F1 when
            there is none); ``"squad"``: the official SQuAD/HotpotQA F1 (spec §2.5, §13 item 15).
        f1_tokenizer: a tokenizer of the task's own for ``f1="tokens"`` (anything with
            ``tokenize(str) -> list[str]``).
        tag_answers: ``"code"`` (default): an ``<A>`` answer as written, unstripped, as the
            reference parser returns and compares it; ``"stripped"``: stripped (so ``<A> x </A>``
            and ``<A>x</A>`` agree).
        style: how answers are read (:data:`~optima_env.prompts.STYLES`): ``"paper"`` (default),
            ``<A>answer</A>`` only; ``"small"``, for models too small to write the tag, the tag, else
            ``Answer: x``, else the whole turn (:func:`~optima_env.scoring.extract_answer_phrase`).
        **kwargs: data and agent options of :class:`~optima_env.families.base.DatasetTask`.
    """

    family = "information_exchange"
    num_formats = len(FORMAT_EXAMPLES)

    def __init__(
        self,
        *,
        f1: str = "tokens",
        f1_tokenizer: Tokenizer | None = None,
        tag_answers: str = "code",
        style: str = "paper",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if style not in STYLES:
            raise TaskContractError(f"style must be one of {STYLES}, got {style!r}")
        if tag_answers not in TAG_ANSWERS:
            raise TaskContractError(f"tag_answers must be one of {TAG_ANSWERS}, got {tag_answers!r}")
        self.init_f1(f1, f1_tokenizer)
        self.tag_answers = tag_answers
        self.style = style

    @abc.abstractmethod
    def deal(self, sample: TaskSample, rng: random.Random) -> list[list[str]]:
        """One list of evidence units per agent (in ``self.agents`` order)."""

    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        self.check_format_index(format_index)
        hands = self.deal(sample, rng)
        question = self.question_text(sample)
        views = {}
        for agent, hand in zip(self.agents, hands, strict=True):
            base = render(
                INFORMATION_EXCHANGE_PROMPT,
                name=agent,
                partner=join_names([a for a in self.agents if a != agent]),
                question=question,
                information="\n".join(hand),
            )
            prompt = base if format_index is None else with_format_block(base, FORMAT_EXAMPLES[format_index])
            views[agent] = AgentView(
                agent=agent, system_prompt=prompt, base_system_prompt=base, private=tuple(hand)
            )
        return views

    def extract_answer(self, text: str) -> str | None:
        if self.style == "small":
            return extract_answer_phrase(text, whole_text=True)
        return extract_tagged(text, "A", strip=self.tag_answers != "code")


class SupportingFactsTask(InformationExchangeTask):
    """Supporting paragraphs dealt in turn, distractors at random (HotpotQA, 2WikiMultihopQA).

    Args:
        full_paragraphs: a paragraph contributes all its sentences; ``False`` gives only the first
            sentence (the reference HotpotQA loader, spec §2.1 quirk 1). Default per dataset.
        strict_split: keep each supporting title once, so no gold paragraph reaches two agents
            (spec §13 item 11); ``False`` deals one entry per supporting fact, as the reference.
        **kwargs: see :class:`InformationExchangeTask`.
    """

    shuffle_supporting: ClassVar[bool] = True
    """Deal the supporting titles in random order (HotpotQA) rather than listed order (2Wiki)."""
    default_full_paragraphs: ClassVar[bool] = False

    def __init__(self, *, full_paragraphs: bool | None = None, strict_split: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.full_paragraphs = (
            self.default_full_paragraphs if full_paragraphs is None else bool(full_paragraphs)
        )
        self.strict_split = bool(strict_split)

    def deal(self, sample: TaskSample, rng: random.Random) -> list[list[str]]:
        return deal_supporting(
            sample,
            len(self.agents),
            rng,
            shuffle=self.shuffle_supporting,
            first_sentence_only=not self.full_paragraphs,
            strict=self.strict_split,
        )


class ShuffledSnippetsTask(InformationExchangeTask):
    """Context units (one sentence per paragraph: search snippets) shuffled and dealt in turn."""

    def deal(self, sample: TaskSample, rng: random.Random) -> list[list[str]]:
        return deal_shuffled([p.text for p in sample.context], len(self.agents), rng)


class HalvesTask(InformationExchangeTask):
    """The story split in contiguous parts (halves for two agents); the question lists the options."""

    def deal(self, sample: TaskSample, rng: random.Random) -> list[list[str]]:
        return deal_halves([p.text for p in sample.context], len(self.agents))

    def question_text(self, sample: TaskSample) -> str:
        if not sample.options:
            return sample.question
        return f"{sample.question}\nPlease choose your answer from {options_list(sample.options)}"
