"""Prompts of the baselines: single-agent CoT, natural-language MAD and AutoForm (spec §8.2).

The paper releases none of its baseline prompts, so these are written here, in our own words:

* **CoT** (one agent, Wei et al. 2022): the question, every piece of evidence the agents would
  hold between them (information exchange) or the problem alone (debate), "think step by step",
  then the final answer in the task's answer format.
* **MAD** (Du et al. 2024, natural-language multi-agent debate/exchange): the same agents, roles
  and private evidence as the task's own views, but told to talk in plain natural language. The
  task prompts (spec §2.3) ask for a terse, non-natural-language format, which is what Optima
  trains towards; MAD is the untrained system *without* that request.
* **AutoForm** (Chen et al. 2024, "Beyond Natural Language: LLMs Leveraging Alternative Formats for
  Enhanced Reasoning and Communication", Findings of EMNLP 2024): the MAD prompt with the
  instruction to communicate in any concise non-natural-language format instead.

The answer format (``<A>answer</A>`` or ``\\boxed{answer}``) is found by probing the task's own
answer extractor (:func:`answer_format`), so the prompts work for any task id; a task whose
extractor accepts neither is played with its own prompts (see :mod:`benchmarks.evaluation.methods`).
"""

from __future__ import annotations

from collections.abc import Sequence
from string import Template

from optima_env.prompts import join_names, render
from optima_env.task import Task
from optima_env.types import TaskSample

__all__ = [
    "AUTOFORM_STYLE",
    "NATURAL_STYLE",
    "answer_format",
    "answer_instruction",
    "cot_prompt",
    "problem_text",
    "styled_prompt",
]

_PROBE = "17"
_FORMATS = {"tag": "<A>answer</A>", "boxed": "\\boxed{answer}"}

NATURAL_STYLE = "Talk in plain, natural language: explain what you know and your reasoning in full sentences."
"""The MAD communication instruction."""

AUTOFORM_STYLE = (
    "Do not use natural language. Use any non-natural-language format that is concise and clear "
    "for the content (for example code, pseudocode, JSON, a table, logical or mathematical "
    "expressions), and switch to natural language only where nothing else will do."
)
"""The AutoForm communication instruction (after Chen et al. 2024, paraphrased)."""

_COT = Template(
    """Answer the question below on your own. Think step by step, then give your final answer as \
${answer_format}.

${problem}"""
)

_PEER = Template(
    """You are ${name}. You and ${partner} must answer the question below together. Each of you \
holds only part of the information needed, so keep exchanging what you know until you can answer.
${style}

${problem}

When you know the answer, write it as ${answer_format}. The conversation ends when every agent \
has given the same answer this way. Begin your response with "${name}:"."""
)

_SOLVER = Template(
    """You are ${name}, and you solve the problem below. ${partner} checks your work and may point \
out mistakes. Reason step by step and take ${partner}'s feedback into account.
${style}

${problem}

End every message with your current final answer as ${answer_format}. Begin your response with \
"${name}:"."""
)

_CRITIC = Template(
    """You are ${name}, and you review the solution that ${partner} gives to the problem below. \
Look for errors in the reasoning and the calculations and suggest how to fix them, but do not give \
the final answer yourself.
${style}

${problem}

Begin your response with "${name}:"."""
)

_DEBATE_PEER = Template(
    """You are ${name}, and you debate the problem below with ${partner}; nobody has a fixed role. \
Solve it yourself, check the others' reasoning and point out their mistakes.
${style}

${problem}

End every message with your current final answer as ${answer_format}. Begin your response with \
"${name}:"."""
)

_TEMPLATES = {"solver": _SOLVER, "critic": _CRITIC}


def answer_format(task: Task) -> str | None:
    """``"tag"`` if the task reads answers from ``<A>...</A>``, ``"boxed"`` for ``\\boxed{...}``.

    Found by asking the task's extractor to read a probe answer; ``None`` when it reads neither.
    """
    for kind, text in (("tag", f"<A>{_PROBE}</A>"), ("boxed", f"\\boxed{{{_PROBE}}}")):
        try:
            got = task.extract_answer(text)
        except Exception:  # an extractor must not raise, but a probe must not crash a run either
            got = None
        if got is not None and _PROBE in got:
            return kind
    return None


def answer_instruction(kind: str) -> str:
    """The answer pattern of a format kind (``<A>answer</A>`` or ``\\boxed{answer}``)."""
    return _FORMATS[kind]


def problem_text(sample: TaskSample, information: Sequence[str] = (), *, header: str = "") -> str:
    """The question, its options (when not already in it) and the given evidence lines."""
    parts = [f"Question: {sample.question}"]
    if sample.options and not all(o in sample.question for o in sample.options):
        parts.append(
            "Options (answer with the text of one option):\n" + "\n".join(f"- {o}" for o in sample.options)
        )
    if information:
        parts.append(f"{header or 'Information'}:\n" + "\n".join(information))
    return "\n\n".join(parts)


def cot_prompt(sample: TaskSample, information: Sequence[str], *, kind: str) -> str:
    """The single-agent chain-of-thought prompt (the agent sees all the evidence)."""
    return render(_COT, answer_format=_FORMATS[kind], problem=problem_text(sample, information))


def styled_prompt(
    *,
    name: str,
    partners: Sequence[str],
    role: str,
    sample: TaskSample,
    private: Sequence[str],
    kind: str,
    style: str,
    family: str = "information_exchange",
) -> str:
    """One agent's MAD or AutoForm system prompt.

    Args:
        name: the agent's name.
        partners: the other agents' names.
        role: ``solver`` or ``critic`` (debate); any other role gets the peer prompt of the family.
        sample: the instance.
        private: the evidence dealt to this agent.
        kind: the answer format (:func:`answer_format`).
        style: :data:`NATURAL_STYLE` or :data:`AUTOFORM_STYLE`.
        family: the task family; debate peers (no fixed roles) get the peer-debate prompt.
    """
    template = _TEMPLATES.get(role, _PEER if family == "information_exchange" else _DEBATE_PEER)
    problem = problem_text(sample, private, header="Your information")
    return render(
        template,
        name=name,
        partner=join_names(list(partners)),
        style=style,
        problem=problem,
        answer_format=_FORMATS[kind],
    )
