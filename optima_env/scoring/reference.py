"""The reference code's answer parsers and exact match, reproduced (``answerParser/parser.py``,
``reward/deploy_reward.py``; spec §2.4, §2.5).

* :func:`parse_tagged_answer`: ``re.findall(r"<A>(.*?)</A", text)[-1]``, **not stripped**: the
  env's termination compares these strings as they are (the reference's ``tmp_answer``).
* :func:`parse_boxed_answer`: ``math_parser``: the content of the LAST ``\\boxed{`` (``rfind``),
  braces counted from there; an unclosed last box yields ``None`` (no fallback to an earlier
  box), ``\\fbox`` is not a box; then :func:`normalize_final_answer`.
* :func:`normalize_final_answer`: ``normalize_final_answer`` of Lewkowycz et al. (2022) as the
  reference copies it, character for character (its quirks included: ``"ft"`` is cut out of
  ``\\left``, ``"a "`` out of ``\\delta x``). Its ``$...$``, ``\\text{}``, ``\\textbf{}``,
  ``\\overline{}`` and ``\\boxed{}`` regexes are run as linear-time rewrites, line by line, with the
  same result (:mod:`optima_env.scoring.math_norm` has them).
* :func:`reference_exact_match`: ``gold.strip().lower() == answer.strip().strip("\\\\").lower()``,
  the training reward of GSM8K, ARC-Challenge and MMLU (``score_type="exact-match"``).

The lenient extractors and normalizers (:func:`~optima_env.scoring.extract_boxed`,
:func:`~optima_env.scoring.normalize_math_answer`, :func:`~optima_env.scoring.choice_match`) stay
available as the tasks' named options.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from optima_env.scoring._validate import check_optional_str, check_str
from optima_env.scoring.extract import extract_tagged
from optima_env.scoring.math_norm import (
    _SUBSTITUTIONS,
    _keep_first_math_span,
    _unwrap_boxed_greedy,
    _unwrap_lazy,
)

__all__ = ["normalize_final_answer", "parse_boxed_answer", "parse_tagged_answer", "reference_exact_match"]

# answerParser/parser.py uses the substitutions of Lewkowycz et al. (math_norm's table, verbatim).
_REMOVED_EXPRESSIONS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters",
    "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
    r",\!", "{,}", '"', "\\dots",
)  # fmt: skip
_FRAC = re.compile(r"(frac)([^{])(.)")
_SQRT = re.compile(r"(sqrt)([^{])")


def parse_tagged_answer(text: str) -> str | None:
    """The reference's ``hotpot_qa_parser``: the last ``<A>...</A`` on one line, as written.

    >>> parse_tagged_answer("Alice: <A> Paris </A>")
    ' Paris '
    >>> parse_tagged_answer("no tag") is None
    True
    """
    return extract_tagged(text, "A", strip=False)


def parse_boxed_answer(text: str) -> str | None:
    """The reference's ``math_parser``: the normalized content of the last ``\\boxed{``, or ``None``.

    >>> parse_boxed_answer(r"\\boxed{1} and \\boxed{2}")
    '2'
    >>> parse_boxed_answer(r"\\boxed{1} and \\boxed{2") is None   # the last box is unclosed
    True
    >>> parse_boxed_answer(r"\\fbox{3}") is None
    True
    """
    check_str("parse_boxed_answer", "text", text)
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    start += len("\\boxed{")
    depth, end = 1, start
    while depth > 0 and end < len(text):
        char = text[end]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        end += 1
    return normalize_final_answer(text[start : end - 1]) if depth == 0 else None


def normalize_final_answer(final_answer: str) -> str:
    """Lewkowycz et al. (2022), appendix D, exactly as the reference code has it.

    >>> normalize_final_answer("x = 1,000 dollars")
    '1000'
    >>> normalize_final_answer(r"\\left( 1, 2 \\right)")   # the reference's quirk: "ft" goes
    '\\\\le(1,2\\\\right)'
    """
    check_str("normalize_final_answer", "final_answer", final_answer)
    final_answer = final_answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expression in _REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expression, "")
    final_answer = _per_line(final_answer, _keep_first_math_span)
    for command in ("\\text{", "\\textbf{", "\\overline{"):
        final_answer = _per_line(final_answer, lambda line, c=command: _unwrap_lazy(line, c))
    final_answer = _per_line(final_answer, _unwrap_boxed_greedy)
    final_answer = _FRAC.sub("frac{\\2}{\\3}", final_answer)
    final_answer = _SQRT.sub("sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")
    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer


def _per_line(text: str, step: Callable[[str], str]) -> str:
    """Apply a one-line rewrite of a reference regex (``.`` stops at newlines) to every line."""
    return "\n".join(step(line) for line in text.split("\n"))


def reference_exact_match(answer: str | None, gold: str) -> float:
    """1.0 when ``gold.strip().lower() == answer.strip().strip("\\\\").lower()``, else 0.0.

    >>> reference_exact_match(" Blue Whale ", "blue whale"), reference_exact_match("18.00", "18")
    (1.0, 0.0)
    >>> reference_exact_match(None, "18")
    0.0
    """
    answer = check_optional_str("reference_exact_match", "answer", answer)
    check_str("reference_exact_match", "gold", gold)
    if answer is None:
        return 0.0
    return float(gold.strip().lower() == answer.strip().strip("\\").lower())
