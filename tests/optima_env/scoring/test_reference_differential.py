"""Differential tests: the project's default (``code``) scoring against a literal port of the
reference functions, on thousands of seeded random strings (spec §2.4, §2.5, §13 item 15).

The port below is the reference code (github.com/thunlp/Optima) copied as it is:
``answerParser/parser.py`` ``math_parser`` and ``normalize_final_answer`` (with its regexes), and
``reward/reward.py`` ``cal_f1_score``. Every mismatch found is reported with its input.
"""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from optima_env import make_task
from optima_env.scoring import f1, parse_boxed_answer
from optima_env.types import TaskSample

CASES = 10_000

# -- the reference code, verbatim (answerParser/parser.py) -----------------------------------------
SUBSTITUTIONS = [
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
]
REMOVED_EXPRESSIONS = [
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters",
    "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
    r",\!", "{,}", '"', "\\dots",
]  # fmt: skip


def normalize_final_answer(final_answer: str) -> str:
    final_answer = final_answer.split("=")[-1]

    for before, after in SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")

    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)

    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")

    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")

    return final_answer


def math_parser(text: str) -> str | None:
    start_idx = text.rfind(r"\boxed{")
    if start_idx == -1:
        return None

    start_idx += 7
    brace_count = 1
    end_idx = start_idx

    while brace_count > 0 and end_idx < len(text):
        if text[end_idx] == "{":
            brace_count += 1
        elif text[end_idx] == "}":
            brace_count -= 1
        end_idx += 1

    if brace_count == 0:
        return normalize_final_answer(text[start_idx : end_idx - 1])
    else:
        return None


# -- the reference code, verbatim (reward/reward.py) -----------------------------------------------
def cal_f1_score(ref: str, tar: str, tokenizer) -> float:
    ref_token = tokenizer.tokenize(ref.lower().strip().strip("m=").strip("m = "))  # noqa: B005
    tar_token = tokenizer.tokenize(tar.lower().strip().strip("m=").strip("m = "))  # noqa: B005
    all_tokens = set(ref_token + tar_token)  # noqa: F841 - unused in the reference too

    counter_ref = Counter(ref_token)
    counter_tar = Counter(tar_token)

    tp = sum((counter_ref & counter_tar).values())
    fp = sum((counter_tar - counter_ref).values())
    fn = sum((counter_ref - counter_tar).values())

    precision = tp / (tp + fp) if (tp + fp) > 0 else 0
    recall = tp / (tp + fn) if (tp + fn) > 0 else 0

    if precision + recall == 0:
        f1_score = 0
    else:
        f1_score = 2 * (precision * recall) / (precision + recall)
    return f1_score


# -- random inputs -----------------------------------------------------------------------------------
BOX_PIECES = (
    "\\boxed{", "\\boxed{", "\\boxed{", "\\boxed ", "\\fbox{", "\\fbox{", "{", "}", "}", "}", "}", "}", "1",
    "2", "0", ",", ".", " ", "=", "$",
    "\\frac", "\\dfrac", "\\sqrt", "\\text{", "\\textbf{", "\\overline{", "\\left(", "\\right)", "a ",
    "an ", "x", "dollars", "^\\circ", "\n", "\\$", "\\boxed{\\boxed{", "The answer is ",
)  # fmt: skip
F1_PIECES = (
    "the", "The", "Eiffel", "eiffel", "Tower", "tower", "m", "=", "m =", " ", "  ", ",", ".", "'s", "-",
    "1", "1,000", "Zürich", "zurich", "yes", "no", "a", "An", "of", "New York", "\n", "Paris", "(", ")",
)  # fmt: skip


def random_strings(pieces: tuple[str, ...], seed: int, count: int = CASES, longest: int = 14) -> list[str]:
    """``count`` strings of up to ``longest`` pieces, each piece followed by a space or not."""
    rng = random.Random(seed)
    return [
        "".join(rng.choice(pieces) + rng.choice(("", " ")) for _ in range(rng.randint(0, longest)))
        for _ in range(count)
    ]


def mismatches(inputs, ours, theirs) -> list:
    return [(x, ours(x), theirs(x)) for x in inputs if ours(x) != theirs(x)]


# -- \boxed extraction -------------------------------------------------------------------------------
def test_boxed_parser_equals_the_reference_parser_on_random_strings() -> None:
    texts = random_strings(BOX_PIECES, seed=48)
    assert sum(math_parser(t) is not None for t in texts) > CASES // 10  # over a thousand boxes read
    assert mismatches(texts, parse_boxed_answer, math_parser)[:5] == []


@pytest.mark.parametrize("task_id", ["debate/gsm8k-v0", "debate/math-v0"])
def test_code_tasks_read_turn_answers_as_the_reference_on_random_strings(task_id) -> None:
    # the reference's termination treats "" as no answer (tmp_answer != None and tmp_answer != "")
    task = make_task(task_id)
    texts = random_strings(BOX_PIECES, seed=4800)
    assert mismatches(texts, task.extract_answer, lambda t: math_parser(t) or None)[:5] == []


@pytest.mark.parametrize(
    ("text", "code", "lenient"),
    [
        (r"\boxed{3} then \boxed{4", None, "3"),  # the unclosed last box: no answer in the reference
        (r"\fbox{7}", None, "7"),  # \fbox is no box in the reference
        (r"\boxed{1} and \boxed{2}", "2", "2"),
    ],
)
def test_the_lenient_switch_reads_what_the_reference_does_not(text, code, lenient) -> None:
    assert make_task("debate/gsm8k-v0").extract_answer(text) == code
    assert make_task("debate/gsm8k-v0", math_answers="lenient").extract_answer(text) == lenient


def test_the_lenient_switch_differs_from_the_reference_on_random_strings() -> None:
    # the switch is a real departure: the same inputs, many readings differ
    lenient = make_task("debate/math-v0", math_answers="lenient")
    texts = random_strings(BOX_PIECES, seed=48)
    assert len(mismatches(texts, lenient.extract_answer, lambda t: math_parser(t) or None)) > CASES // 20


# -- IE F1 -------------------------------------------------------------------------------------------
class WordTokenizer:
    """Whitespace words: a second tokenizer, so the port is not checked against one vocabulary only."""

    def tokenize(self, text: str) -> list[str]:
        return text.split()


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """The embedded model's BPE tokenizer (a Llama-style byte-level BPE, offline)."""
    transformers = pytest.importorskip("transformers")
    from optima_env.models import ensure_embedded_model

    return transformers.AutoTokenizer.from_pretrained(ensure_embedded_model())


@pytest.mark.parametrize("which", ["bpe", "words"])
def test_token_f1_equals_the_reference_f1_on_random_strings(which, request) -> None:
    tokenizer = request.getfixturevalue("bpe_tokenizer") if which == "bpe" else WordTokenizer()
    preds, golds = random_strings(F1_PIECES, seed=15), random_strings(F1_PIECES, seed=1515)
    pairs = list(zip(preds, golds, strict=True))
    found = [
        (p, g)
        for p, g in pairs
        if f1(p, g, tokenizer=tokenizer) != pytest.approx(cal_f1_score(g, p, tokenizer), abs=1e-12)
    ]
    assert sum(cal_f1_score(g, p, tokenizer) > 0 for p, g in pairs) > CASES // 10  # overlaps occur
    assert found[:5] == []


def test_ie_task_scores_with_the_policy_tokenizer_as_the_reference(bpe_tokenizer) -> None:
    # TriviaQA-style aliases: the reference takes the max of cal_f1_score over them
    task = make_task("ie/triviaqa-v0")
    preds = random_strings(F1_PIECES, seed=7, count=2000)
    aliases = [tuple(random_strings(F1_PIECES, seed=70 + i, count=2000)) for i in range(3)]
    found = []
    for i, pred in enumerate(preds):
        golds = tuple(a[i] for a in aliases)
        sample = TaskSample(id=str(i), question="q", answers=golds)
        ours = task.score_with(pred, sample, tokenizer=bpe_tokenizer)
        theirs = max(cal_f1_score(g, pred, bpe_tokenizer) for g in golds)
        if ours != pytest.approx(theirs, abs=1e-12):
            found.append((pred, golds, ours, theirs))
    assert found[:5] == []
