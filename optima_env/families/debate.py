"""Debate (spec §2.2): a solver and a critic, no private evidence.

With two agents, Alice is the **solver** and speaks first; Bob is the **critic**, told to find
errors and suggest fixes but never to give the answer (:data:`~optima_env.prompts.CRITIC_PROMPT`).
With three or more agents (the paper's v2 three-agent variant, whose code was not released) there
are no fixed roles: every agent gets :data:`~optima_env.prompts.PEER_DEBATE_PROMPT`, solves, checks
the others and answers in the task's answer format.

With a format index (spec §4) only the solver's prompt gets the example block (every peer's, with
three or more agents); math tasks have no pool.

* :class:`MathDebateTask`: GSM8K and MATH: by default (``math_answers="code"``) the answer is the
  reference parser's (:func:`~optima_env.scoring.parse_boxed_answer`: the last ``\\boxed{``, none
  when it is unclosed, ``\\fbox`` not a box, then the verbatim
  :func:`~optima_env.scoring.normalize_final_answer`), and the env's termination compares these
  strings exactly; ``math_answers="lenient"`` takes the last balanced box (``\\fbox`` too) with the
  fuller :func:`~optima_env.scoring.normalize_math_answer`, so termination also sees ``1/2`` and
  ``\\frac12`` as the same answer. ``style="small"``, for models too small to box their answer (a
  departure from the reference, off by default): the lenient box, else the last ``answer is X`` /
  ``Answer: X`` line (GSM8K: its first number), else the turn's last number
  (:func:`read_small_math_answer`).
* :class:`ChoiceDebateTask`: ARC-Challenge and MMLU: the options are appended to the question,
  the answer is the last ``<A>...</A>`` (as written, by default), scored by the reference's exact
  match of the option text (:func:`~optima_env.scoring.reference_exact_match`, default) or the
  lenient :func:`~optima_env.scoring.choice_match`. ``style="small"``: the ``<A>`` answer, else the
  last ``answer is X`` / ``Answer: X`` phrase (:func:`~optima_env.scoring.extract_answer_phrase`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from string import Template
from typing import Any, ClassVar

from optima_env.errors import TaskContractError
from optima_env.families.base import DatasetTask, options_list
from optima_env.prompts import (
    CHOICE_SOLVER_PROMPT,
    CRITIC_PROMPT,
    FORMAT_EXAMPLES,
    PEER_DEBATE_PROMPT,
    STYLES,
    join_names,
    render,
    with_format_block,
)
from optima_env.scoring import (
    choice_match,
    extract_answer_phrase,
    extract_boxed,
    extract_tagged,
    normalize_math_answer,
    parse_boxed_answer,
    reference_exact_match,
)
from optima_env.types import AgentView, TaskSample

__all__ = [
    "MATH_ANSWERS",
    "ChoiceDebateTask",
    "DebateTask",
    "MathDebateTask",
    "extract_math_answer",
    "read_small_math_answer",
]

MATH_ANSWERS = ("code", "lenient")
"""How a math turn's answer is read: the reference parser, or the lenient extraction."""
_ANSWER_LINE = re.compile(r"\banswer(?:\s+is\s*:?|\s*:)[ \t*]*\n?[ \t]*([^\n]+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


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


def read_small_math_answer(text: str, *, numeric: bool) -> str | None:
    """A math answer for models too small to box it: the lenient box, else the rest of the last
    ``answer is X`` / ``Answer: X`` line, else the turn's last number; normalized.

    With ``numeric`` (GSM8K), the answer line gives its first number (``"425,000."`` -> ``425000``).

    >>> read_small_math_answer("The answer is: 540", numeric=True)
    '540'
    >>> read_small_math_answer(r"So, the answer is $\\frac{1}{2}$.", numeric=False)
    '\\\\frac{1}{2}'
    >>> read_small_math_answer("so we get 7 and then 12 apples", numeric=True)
    '12'
    >>> read_small_math_answer("no number here", numeric=True) is None
    True
    """
    boxed = extract_math_answer(text)
    if boxed is not None:
        return boxed
    lines = _ANSWER_LINE.findall(text)
    if lines:
        phrase = lines[-1].strip().rstrip(".").strip()
        if numeric:
            found = _NUMBER.search(phrase)
            phrase = found.group() if found else phrase
        return normalize_math_answer(phrase).strip() or None
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    return normalize_math_answer(numbers[-1].rstrip(",")).strip() or None


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise TaskContractError(
            f"style must be one of {STYLES} ('paper': the reference's answer reading, 'small': "
            f"a lenient reading for models that do not write the answer format), got {style!r}"
        )


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
    """GSM8K / MATH: boxed answers, no format pool (spec §4: math has a fixed structure).

    Args:
        math_answers: ``"code"`` (default): the reference parser, whose strings the env's
            termination compares exactly; ``"lenient"``: :func:`extract_math_answer` (termination
            then matches equivalent forms such as ``1/2`` and ``\\frac12``).
        style: ``"paper"`` (default): as ``math_answers`` says; ``"small"``: for models too small to
            box their answer, :func:`read_small_math_answer` (a departure from the reference).
        **kwargs: data and agent options of :class:`~optima_env.families.base.DatasetTask`.
    """

    num_formats = 0
    answer_rule = "When you have a final answer, end your message with \\boxed{answer}."
    numeric_answers: ClassVar[bool] = False
    """Whether the answer is a number (GSM8K): the ``small`` style then reads a number."""

    def __init__(self, *, math_answers: str = "code", style: str = "paper", **kwargs: Any) -> None:
        if math_answers not in MATH_ANSWERS:
            raise TaskContractError(f"math_answers must be one of {MATH_ANSWERS}, got {math_answers!r}")
        _check_style(style)
        super().__init__(**kwargs)
        self.math_answers = math_answers
        self.style = style

    def extract_answer(self, text: str) -> str | None:
        if self.style == "small":
            return read_small_math_answer(text, numeric=self.numeric_answers)
        if self.math_answers == "code":
            return parse_boxed_answer(text) or None
        return extract_math_answer(text)


class ChoiceDebateTask(DebateTask):
    """ARC-Challenge / MMLU: options in the question, ``<A>`` answers, the 11-format pool.

    Args:
        strict_choice: ``True`` (default) scores as the reference code does
            (:func:`~optima_env.scoring.reference_exact_match`: the stripped, lowercased answer,
            backslashes stripped, equals the gold option text); ``False`` also accepts the option's
            label (``B``, ``(B)``, ``Answer: B``; ARC's own labels, e.g. ``1``-``4``) and differences
            of case, punctuation and spacing (:func:`~optima_env.scoring.choice_match`).
        tag_answers: ``"code"`` (default): the ``<A>`` answer as written, unstripped, as the
            reference parser returns and compares it; ``"stripped"``: stripped.
        style: ``"paper"`` (default): the ``<A>`` answer only; ``"small"``: else the last
            ``answer is X`` / ``Answer: X`` phrase (a departure from the reference).
        **kwargs: data and agent options of :class:`~optima_env.families.base.DatasetTask`.
    """

    solver_prompt = CHOICE_SOLVER_PROMPT
    num_formats = len(FORMAT_EXAMPLES)
    answer_rule = "When you know the answer, write it as <A>answer</A>."
    options_phrase: ClassVar[str] = "Please choose your answer from {options}"
    """How the options follow the question (``{options}`` = the option texts as a list)."""

    def __init__(
        self, *, strict_choice: bool = True, tag_answers: str = "code", style: str = "paper", **kwargs: Any
    ) -> None:
        if tag_answers not in ("code", "stripped"):
            raise TaskContractError(f"tag_answers must be 'code' or 'stripped', got {tag_answers!r}")
        _check_style(style)
        super().__init__(**kwargs)
        self.strict_choice = bool(strict_choice)
        self.tag_answers = tag_answers
        self.style = style

    def question_text(self, sample: TaskSample) -> str:
        return f"{sample.question}\n{self.options_phrase.format(options=options_list(sample.options))}"

    def extract_answer(self, text: str) -> str | None:
        if self.style == "small":
            return extract_answer_phrase(text)
        return extract_tagged(text, "A", strip=self.tag_answers != "code")

    def score(self, answer: str | None, sample: TaskSample) -> float:
        if self.strict_choice:
            return reference_exact_match(answer, sample.answer)
        labels = sample.metadata.get("labels")
        return float(choice_match(answer, sample.options, sample.answer, labels=labels))

    def scorer_name(self, tokenizer: object = None) -> str:
        """``exact-match`` (the reference's) or ``choice-lenient``."""
        return "exact-match" if self.strict_choice else "choice-lenient"
