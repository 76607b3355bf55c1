"""MATH answer normalization: Lewkowycz et al. (2022) plus the Hendrycks ``strip_string`` fixes.

The core is ``normalize_final_answer`` from appendix D of Lewkowycz et al. (2022), which the
Optima code copies (``answerParser/parser.py``): keep the text after the last ``=``, drop spaces,
units and words such as "dollars" or "degrees", unwrap ``\\text{}``/``\\boxed{}``, drop ``$``,
fix ``\\frac``/``\\sqrt`` shorthand and remove commas from integers. Around it run the cleanups of
Hendrycks et al.'s ``strip_string`` (line breaks, ``\\!``, ``\\left``/``\\right``,
``tfrac``/``dfrac``, ``\\%``, a leading ``.``, ``a/b`` to ``\\frac{a}{b}``).

Deliberate differences from the reference, all of which only make equal answers compare equal:
``\\left``/``\\right`` are removed *before* the unit words (the reference turns ``\\left`` into
``\\le`` by deleting "ft"), and unit words and the articles "a "/"an " are never cut out of
a command name (``\\infty``, ``\\delta x``); the shorthand fixes skip ``\\frac\\pi2`` and
``\\sqrt[3]{x}`` (the reference mangles them) and also handle ``\\frac1{2}`` and
``\\frac{1}2``; trailing periods, a ``°`` sign and commas in negative or decimal numbers
(``-1,000.5``) are removed; ``0.5`` is kept as is. Every regex step is rewritten to run in
linear time on any input.
"""

from __future__ import annotations

import re

from optima_env.scoring._validate import check_str

__all__ = ["normalize_math_answer"]

# Verbatim from Lewkowycz et al. (2022), appendix D.
_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED_WORDS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm",
    "pounds", "meters", "meals", "edges", "students", "childrentickets", "multiples",
)  # fmt: skip
_REMOVED_EXPRESSIONS = (
    "\\ldots", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}",
    "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots",
)  # fmt: skip

# A LaTeX command name is matched first and kept whole, so that "ft" is not cut out of
# "\\left" or "\\infty", nor "a " out of "\\delta x" (the reference does both).
_COMMAND = r"(\\[A-Za-z]+)"
_ARTICLES = re.compile(_COMMAND + r"|an |a ")
_WORDS = re.compile(_COMMAND + "|" + "|".join(sorted(_REMOVED_WORDS, key=len, reverse=True)))
_FRAC_SHORT = re.compile(r"frac([^{\\])(.)")
_FRAC_SECOND = re.compile(r"(frac\{[^{}]*\})([^{\\])")
_SQRT_SHORT = re.compile(r"sqrt([^{\[\\])")
_INT_RATIO = re.compile(r"(-?(?:0|[1-9][0-9]*))/(0|[1-9][0-9]*)")
_GROUPED_NUMBER = re.compile(r"-?[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?")


def normalize_math_answer(answer: str) -> str:
    """Normalize a MATH-style final answer so that equal answers become equal strings.

    Pure string operations; nothing is parsed or evaluated.

    Args:
        answer: The answer text, usually the content of the last ``\\boxed{}``.

    Returns:
        The normalized answer (possibly empty).

    Raises:
        ScoringError: If ``answer`` is not a str.

    >>> normalize_math_answer(r"\\dfrac12")
    '\\\\frac{1}{2}'
    >>> normalize_math_answer("x = 1,000 dollars")
    '1000'
    >>> normalize_math_answer(r"90^\\circ")
    '90'
    >>> normalize_math_answer(r"\\text{(B)}")
    '(B)'
    >>> normalize_math_answer("3/4")
    '\\\\frac{3}{4}'
    """
    check_str("normalize_math_answer", "answer", answer)
    text = _pre_clean(answer)
    text = _lewkowycz(text)
    return _post_clean(text)


def _pre_clean(text: str) -> str:
    text = text.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    return text.replace("\\left", "").replace("\\right", "")


def _lewkowycz(text: str) -> str:
    # The input holds no newline (see _pre_clean), so each reference regex that stops at line ends
    # acts on the whole string; the steps below give the same result in linear time.
    text = text.split("=")[-1]
    text = _ARTICLES.sub(_keep_command, text)
    for before, after in _SUBSTITUTIONS[2:]:
        text = text.replace(before, after)
    text = _WORDS.sub(_keep_command, text)
    for expression in _REMOVED_EXPRESSIONS:
        text = text.replace(expression, "")
    text = _keep_first_math_span(text)
    for command in ("\\text{", "\\textbf{", "\\overline{"):
        text = _unwrap_lazy(text, command)
    text = _unwrap_boxed_greedy(text)
    text = _FRAC_SHORT.sub(_fix_frac, text)
    text = _FRAC_SECOND.sub(r"\1{\2}", text)
    text = _SQRT_SHORT.sub(r"sqrt{\1}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text


def _post_clean(text: str) -> str:
    text = text.replace("\\%", "").replace("%", "").replace("°", "")
    text = text.replace("{.", "{0.")
    if text.startswith("."):
        text = "0" + text
    text = text.rstrip(".").strip()
    ratio = _INT_RATIO.fullmatch(text)
    if ratio:
        text = f"\\frac{{{ratio.group(1)}}}{{{ratio.group(2)}}}"
    if _GROUPED_NUMBER.fullmatch(text):
        text = text.replace(",", "")
    return text


def _keep_first_math_span(text: str) -> str:
    """``re.sub(r"(.*?)(\\$)(.*?)(\\$)(.*)", "$\\3$", text)`` on a one-line string."""
    first = text.find("$")
    second = text.find("$", first + 1) if first >= 0 else -1
    if second < 0:
        return text
    return "$" + text[first + 1 : second] + "$"


def _unwrap_lazy(text: str, command: str) -> str:
    """``re.sub(r"(\\\\cmd\\{)(.*?)(\\})", r"\\2", text)`` on a one-line string."""
    out: list[str] = []
    pos = 0
    while True:
        start = text.find(command, pos)
        if start < 0:
            break
        end = text.find("}", start + len(command))
        if end < 0:
            break  # no closing brace after this opener, hence none after later ones
        out.append(text[pos:start])
        out.append(text[start + len(command) : end])
        pos = end + 1
    out.append(text[pos:])
    return "".join(out)


def _unwrap_boxed_greedy(text: str) -> str:
    """``re.sub(r"(\\\\boxed\\{)(.*)(\\})", r"\\2", text)`` on a one-line string."""
    start = text.find("\\boxed{")
    end = text.rfind("}")
    if start < 0 or end < start + len("\\boxed{"):
        return text
    return text[:start] + text[start + len("\\boxed{") : end] + text[end + 1 :]


def _keep_command(match: re.Match[str]) -> str:
    return match.group(1) or ""


def _fix_frac(match: re.Match[str]) -> str:
    numerator, after = match.group(1), match.group(2)
    if after == "{":
        return "frac{" + numerator + "}{"
    return "frac{" + numerator + "}{" + after + "}"
