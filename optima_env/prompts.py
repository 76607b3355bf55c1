"""Prompt templates shared by task plugins (written from the paraphrases in spec §2.2-§2.3 and §4).

Templates use :class:`string.Template` placeholders, as the reference code does:
``${name}``, ``${partner}``, ``${question}`` and ``${information}`` (plus ``${answer_rule}`` in the
peer-debate prompt). Every prompt ends with the line asking the agent to begin with ``"Name:"``.

* :data:`INFORMATION_EXCHANGE_PROMPT`: both agents of an information-exchange task (§2.3).
* :data:`GSM8K_SOLVER_PROMPT`, :data:`MATH_SOLVER_PROMPT`: the debate solver on math (§2.2).
* :data:`CHOICE_SOLVER_PROMPT`: the debate solver on ARC-Challenge / MMLU.
* :data:`CRITIC_PROMPT`: the debate critic, who finds errors but never gives the answer.
* :data:`PEER_DEBATE_PROMPT`: every agent of a debate among three or more (no fixed roles).
* :data:`FORMAT_EXAMPLES`: the format-diverse pool (§4); :func:`with_format_block` inserts one block
  right before a prompt's last line, so removing it gives back the base prompt exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from string import Template

__all__ = [
    "CHOICE_SOLVER_PROMPT",
    "CRITIC_PROMPT",
    "FORMAT_EXAMPLES",
    "FORMAT_NAMES",
    "GSM8K_SOLVER_PROMPT",
    "INFORMATION_EXCHANGE_PROMPT",
    "MATH_SOLVER_PROMPT",
    "PEER_DEBATE_PROMPT",
    "STYLES",
    "join_names",
    "render",
    "with_format_block",
]

INFORMATION_EXCHANGE_PROMPT = Template(
    """You are ${name}. You do not talk in natural language but in a very compact format, because you \
run on a small device where every extra token costs energy and too many may shut it down. Work with \
${partner} to answer the question below.

Question: ${question}

Your information:
${information}

Guidelines:
1. Your information is incomplete. Keep exchanging facts with ${partner} until you can answer.
2. When you know the answer, write it as <A>answer</A>. The conversation ends only when every agent \
has written the same answer this way.
3. Reason step by step.
4. Use only your information and what ${partner} tells you.
5. Your token budget is tiny: prefer structured formats, code or a shorthand of your own, drop \
anything unnecessary, but stay informative.
6. Begin your response with "${name}:"."""
)

STYLES = ("paper", "small")
"""Answer styles of the tasks (same prompt): ``paper``, the reference's reading (``<A>answer</A>``,
or ``\\boxed{}`` for math); ``small``, for models too small to write the format: information
exchange reads the tag, else ``Answer: x``, else the whole turn
(:func:`optima_env.scoring.extract_answer_phrase` with ``whole_text=True``); the debate tasks, see
:mod:`optima_env.families.debate`."""


def join_names(names: Sequence[str]) -> str:
    """``["Bob"]`` -> ``"Bob"``; ``["Bob", "Charlie"]`` -> ``"Bob and Charlie"``.

    >>> join_names(["Bob", "Charlie", "Dave"])
    'Bob, Charlie and Dave'
    """
    names = list(names)
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def render(template: Template, **values: str) -> str:
    """Fill every placeholder (a missing one raises ``KeyError``, never a silent gap)."""
    return template.substitute(**values)


# -- debate (spec §2.2) ----------------------------------------------------------------------------
_COMPACT = (
    "You do not talk in natural language but in a very compact format, because you run on a small "
    "device where every extra token costs energy and too many may shut it down."
)
_BUDGET = (
    "Your token budget is tiny: prefer structured formats, code or a shorthand of your own, drop "
    "anything unnecessary, but stay informative."
)

GSM8K_SOLVER_PROMPT = Template(
    """You are ${name}, an agent who is strong at mathematics. Solve the problem below; ${partner} \
will check your work.

Question: ${question}

Guidelines:
1. Think step by step.
2. End your response with \\boxed{N}, where N is the final number only: no units, no words.
3. Begin your response with "${name}:"."""
)

MATH_SOLVER_PROMPT = Template(
    """You are ${name}, an agent who is strong at mathematics. Solve the problem below; ${partner} \
will check your work.

Question: ${question}

Guidelines:
1. Think step by step.
2. End your response with \\boxed{answer}, where the box holds your final answer and nothing else.
3. Begin your response with "${name}:"."""
)

CHOICE_SOLVER_PROMPT = Template(
    f"""You are ${{name}}. {_COMPACT} ${{partner}} will check your reasoning and tell you when it \
thinks your answer is wrong. Give a complete step-by-step derivation.

Question: ${{question}}

Guidelines:
1. When you know the answer, write it as <A>answer</A>. The conversation ends only when every agent \
has written the same answer this way.
2. Reason step by step.
3. {_BUDGET}
4. Begin your response with "${{name}}:"."""
)

CRITIC_PROMPT = Template(
    f"""You are ${{name}}. {_COMPACT} ${{partner}} is trying to solve the question below; examine \
its reasoning carefully.

Question: ${{question}}

Guidelines:
1. Find the errors in ${{partner}}'s reasoning and say how to fix them, but never give the answer \
yourself.
2. Reason step by step.
3. {_BUDGET}
4. Begin your response with "${{name}}:"."""
)

PEER_DEBATE_PROMPT = Template(
    f"""You are ${{name}}. {_COMPACT} You are debating the question below with ${{partner}}; \
nobody has a fixed role.

Question: ${{question}}

Guidelines:
1. Solve the question yourself, check the others' reasoning and point out their errors.
2. ${{answer_rule}} The conversation ends when the same answer is given twice in a row.
3. Reason step by step.
4. {_BUDGET}
5. Begin your response with "${{name}}:"."""
)

# -- the format-diverse pool (spec §4) -------------------------------------------------------------
FORMAT_NAMES = (
    "matrix / key-value list",
    "table / abbreviated notation",
    "XML / dot notation",
    "array of key:value objects",
    "emoji code",
    "graph notation / shorthand formulas",
    "programming pseudocode",
    "kanji / hieroglyph-like symbols",
    "look-up table",
    "flowchart / railway diagram",
    "colour coding / operator shorthand",
)
"""One name per :data:`FORMAT_EXAMPLES` block, in the same order."""

FORMAT_EXAMPLES = (
    """For example, you can write a matrix of rows:
[["fact1", "value1"], ["fact2", "value2"], ...]
Or a key-value list:
"fact1": "value1"; "fact2": "value2"; ...""",
    """For example, you can write a table:
| key | val |
|-----|-----|
| k1  | v1  |
| k2  | v2  |
Or abbreviated notation:
F1: V1; F2: V2; ...""",
    """For example, you can write XML:
<msg><k1>v1</k1><k2>v2</k2>...</msg>
Or dot notation:
k1.v1; k2.v2; ...""",
    """For example, you can write an array of key:value objects:
[{k1:v1}, {k2:v2}, ...]""",
    """For example, you can write in emoji code:
🔎1️⃣➡️2️⃣; ✅3️⃣; ❓4️⃣; ...""",
    """For example, you can write graph notation:
(A)-[rel]->(B); (B)-[rel]->(C); ...
Or shorthand formulas:
x + y = z; a - b = c; ...""",
    """For example, you can write programming pseudocode:
def solve(facts):
    x = facts[k1]
    return f(x)""",
    """For example, you can write with kanji characters:
人→東; 年=千九百; ...
Or with hieroglyph-like symbols:
𓀀→𓂀; 𓃠=𓆣; ...""",
    """For example, you can write a look-up table:
1 -> A; 2 -> B; ...""",
    """For example, you can write a flowchart:
(start)->(step1)->{check? yes|no}->(end);
Or a railway diagram:
[in] ==> {event1} ==> (choice1 | choice2) ==> [out]""",
    """For example, you can write with colour codes:
RED=unknown, GREEN=confirmed: GREEN:k1=v1; RED:k2; ...
Or operator shorthand (⊕ adds, ⊖ removes):
A ⊕ B → C; D ⊖ E; ...""",
)
"""The 11 example blocks of the pool, one per format family of the released pools (spec §4).

Written for this project following the format list of the paper's released pools; the same
blocks serve information exchange and the ARC-Challenge / MMLU solver prompt.
"""


def with_format_block(prompt: str, block: str) -> str:
    """Insert a format example ``block`` right before the last line of ``prompt``.

    Every prompt here ends with its ``Begin your response with "Name:"`` line, so the block lands
    at the end of the guidelines, as in the reference pools.

    >>> with_format_block("Guidelines:\\n1. Be brief.\\n2. Begin with X:", "For example: k=v")
    'Guidelines:\\n1. Be brief.\\nFor example: k=v\\n2. Begin with X:'
    """
    head, sep, last = prompt.rpartition("\n")
    if not sep:
        return f"{prompt}\n{block}"
    return f"{head}\n{block}\n{last}"
