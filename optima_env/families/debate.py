"""Debate (spec §2.2): a solver and a critic, no private evidence.

With two agents, Alice is the **solver** and speaks first; Bob is the **critic**, told to find
errors and suggest fixes but never to give the answer (:data:`~optima_env.prompts.CRITIC_PROMPT`).
With three or more agents (the paper's v2 three-agent variant, whose code was not released) there
are no fixed roles: every agent gets :data:`~optima_env.prompts.PEER_DEBATE_PROMPT`, solves, checks
the others and answers in the task's answer format.

With a format index (spec §4) only the solver's prompt gets the example block (every peer's, with
three or more agents); math tasks have no pool.

* :class:`MathDebateTask`: GSM8K and MATH: the answer is the last balanced ``\\boxed{}`` of a turn,
  normalized like the reference parser (:func:`~optima_env.scoring.normalize_math_answer`), so the
  env's exact-match termination sees ``1/2`` and ``\\frac12`` as the same answer.
* :class:`ChoiceDebateTask`: ARC-Challenge and MMLU: the options are appended to the question,
  the answer is the last ``<A>...</A>``, scored by :func:`~optima_env.scoring.choice_match`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from string import Template
from typing import Any, ClassVar

from optima_env.families.base import DatasetTask, options_list
from optima_env.prompts import (
    CHOICE_SOLVER_PROMPT,
    CRITIC_PROMPT,
    FORMAT_EXAMPLES,
    PEER_DEBATE_PROMPT,
    join_names,
    render,
    with_format_block,
)
from optima_env.scoring import choice_match, extract_boxed, extract_tagged, normalize_math_answer
from optima_env.types import AgentView, TaskSample

__all__ = ["ChoiceDebateTask", "DebateTask", "MathDebateTask", "extract_math_answer"]


def extract_math_answer(text: str) -> str | None:
    """The normalized content of the last balanced ``\\boxed{}``; ``None`` if none or empty.

    The reference parser's rule (spec §2.4): box content, then the MATH normalization.

    >>> extract_math_answer(r"so x = \\boxed{\\dfrac12}"), extract_math_answer(r"\\boxed{1/2}")
    ('\\\\frac{1}{2}', '\\\\frac{1}{2}')
    >>> extract_math_answer("no box") is None, extract_math_answer(r"\\boxed{ }") is None
    (True, True)
    """
    boxed = extract_boxed(text)
    if boxed is None:
        return None
    return normalize_math_answer(boxed).strip() or None


class DebateTask(DatasetTask):
    """Base of the debate tasks: roles, prompts and the format pool; subclasses extract and score."""

    family = "debate"
    solver_prompt: ClassVar[Template]
    critic_prompt: ClassVar[Template] = CRITIC_PROMPT
    answer_rule: ClassVar[str]
    """The answer-format sentence of the peer-debate prompt (three or more agents)."""

    def roles(self) -> dict[str, str]:
        """``{agent: role}``: ``solver``/``critic`` for two agents, ``peer`` for more."""
        if len(self.agents) == 2:
            return {self.agents[0]: "solver", self.agents[1]: "critic"}
        return {agent: "peer" for agent in self.agents}

    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        self.check_format_index(format_index)
        question = self.question_text(sample)
        views = {}
        for agent, role in self.roles().items():
            partner = join_names([a for a in self.agents if a != agent])
            if role == "peer":
                base = render(
                    PEER_DEBATE_PROMPT,
                    name=agent,
                    partner=partner,
                    question=question,
                    answer_rule=self.answer_rule,
                )
            else:
                template = self.solver_prompt if role == "solver" else self.critic_prompt
                base = render(template, name=agent, partner=partner, question=question)
            prompt = base
            if format_index is not None and role != "critic":
                prompt = with_format_block(base, FORMAT_EXAMPLES[format_index])
            views[agent] = AgentView(agent=agent, system_prompt=prompt, base_system_prompt=base, role=role)
        return views


class MathDebateTask(DebateTask):
    """GSM8K / MATH: boxed answers, no format pool (spec §4: math has a fixed structure)."""

    num_formats = 0
    answer_rule = "When you have a final answer, end your message with \\boxed{answer}."

    def extract_answer(self, text: str) -> str | None:
        return extract_math_answer(text)


class ChoiceDebateTask(DebateTask):
    """ARC-Challenge / MMLU: options in the question, ``<A>`` answers, the 11-format pool.

    Args:
        strict_choice: score as the reference code does: the lowercased, stripped answer must equal
            the gold option text. ``False`` (default) also accepts the option's label (``B``,
            ``(B)``, ``Answer: B``; ARC's own labels, e.g. ``1``-``4``) and differences of case,
            punctuation and spacing.
        **kwargs: data and agent options of :class:`~optima_env.families.base.DatasetTask`.
    """

    solver_prompt = CHOICE_SOLVER_PROMPT
    num_formats = len(FORMAT_EXAMPLES)
    answer_rule = "When you know the answer, write it as <A>answer</A>."
    options_phrase: ClassVar[str] = "Please choose your answer from {options}"
    """How the options follow the question (``{options}`` = the option texts as a list)."""

    def __init__(self, *, strict_choice: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.strict_choice = bool(strict_choice)

    def question_text(self, sample: TaskSample) -> str:
        return f"{sample.question}\n{self.options_phrase.format(options=options_list(sample.options))}"

    def extract_answer(self, text: str) -> str | None:
        return extract_tagged(text, "A")

    def score(self, answer: str | None, sample: TaskSample) -> float:
        labels = sample.metadata.get("labels")
        return float(
            choice_match(answer, sample.options, sample.answer, labels=labels, strict=self.strict_choice)
        )
