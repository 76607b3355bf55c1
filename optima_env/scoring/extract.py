"""Answer extraction from a turn's text: ``<A>...</A>`` tags and LaTeX ``\\boxed{...}``.

Both extractors run in linear time, also on pathological input such as 100,000 characters of
unclosed ``<A>`` or ``\\boxed{``, where the reference regexes would backtrack quadratically.
"""

from __future__ import annotations

import re

from optima_env.errors import ScoringError
from optima_env.scoring._validate import check_str

__all__ = ["extract_answer_phrase", "extract_boxed", "extract_tagged"]

_BOX_OPENERS = re.compile(r"\\(?:boxed|fbox)\{")
_BRACES = re.compile(r"[{}]")
_TAG_NAME = re.compile(r"[^\s<>/]+")
_SPEAKER = re.compile(r"^\s*[^\s:]{1,40}:")
_ANSWER_PHRASE = re.compile(
    r"\banswer(?:\s+is\s*:?|\s*:)[\s*\"']*([^\s.,;!?<>\"*:][^\n.,;!?<>\"*]*)", re.IGNORECASE
)
"""``Answer: x`` / ``answer is x`` / ``answer is: x``; the phrase may follow on the next line and
never starts with a colon (``answer is:`` at a line's end is not the answer ``:``)."""


def extract_tagged(text: str, tag: str = "A", *, strip: bool = True) -> str | None:
    """Return the stripped content of the last ``<tag>...</tag`` span on a single line.

    Same result as the reference ``re.findall(r"<A>(.*?)</A", text)[-1]`` (no DOTALL: the span
    cannot cross a newline; the closing ``>`` is optional), then stripped.

    Args:
        text: The turn text.
        tag: The tag name, ``"A"`` for answers.
        strip: Strip the content; ``False`` returns it as written (the reference parser does not
            strip, and its termination compares the unstripped strings).

    Returns:
        The content of the last match, stripped (``""`` for ``<A></A>``), or ``None`` if no span
        matches.

    Raises:
        ScoringError: If ``text`` is not a str or ``tag`` is not a plain tag name.

    >>> extract_tagged("Alice: I think <A>Paris</A>. Bob: no, <A> Lyon </A>")
    'Lyon'
    >>> extract_tagged("<A>spans\\nlines</A>") is None
    True
    """
    check_str("extract_tagged", "text", text)
    if not isinstance(tag, str) or not _TAG_NAME.fullmatch(tag):
        raise ScoringError(
            f"extract_tagged: expected tag to be a tag name such as 'A', got {tag!r}; "
            f"pass the bare name without angle brackets"
        )
    opener, closer = f"<{tag}>", f"</{tag}"
    last: str | None = None
    pos = 0
    while True:
        start = text.find(opener, pos)
        if start < 0:
            break
        body = start + len(opener)
        end = text.find(closer, body)
        newline = text.find("\n", body)
        if end < 0:
            break  # no closer anywhere after: no later opener can match either
        if 0 <= newline < end:
            pos = newline + 1  # this line has no closer after the opener
            continue
        last = text[body:end]
        pos = end + len(closer)
    if last is None:
        return None
    return last.strip() if strip else last


def extract_boxed(text: str) -> str | None:
    """Return the content of the last balanced ``\\boxed{...}`` (or ``\\fbox{...}``).

    Braces are matched by counting, as the reference parser does, so nested groups are kept
    whole. An occurrence whose braces never close is ignored and the last balanced occurrence
    before it is returned. "Last" means the occurrence that starts last, so for nested boxes the
    inner one wins.

    Args:
        text: The turn text.

    Returns:
        The content between the braces (not stripped), or ``None`` if there is no balanced box.

    Raises:
        ScoringError: If ``text`` is not a str.

    >>> extract_boxed(r"so \\boxed{\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    >>> extract_boxed(r"\\boxed{1} then \\boxed{2}")
    '2'
    >>> extract_boxed(r"\\boxed{3} then \\boxed{4")
    '3'
    """
    check_str("extract_boxed", "text", text)
    openers = [m.end() - 1 for m in _BOX_OPENERS.finditer(text)]
    if not openers:
        return None
    wanted = set(openers)
    closing: dict[int, int] = {}
    stack: list[int] = []
    for match in _BRACES.finditer(text, openers[0]):
        at = match.start()
        if text[at] == "{":
            stack.append(at)
        elif stack:
            opened = stack.pop()
            if opened in wanted:
                closing[opened] = at
    for opened in reversed(openers):
        if opened in closing:
            return text[opened + 1 : closing[opened]]
    return None


def extract_answer_phrase(text: str, *, whole_text: bool = False) -> str | None:
    """The ``<A>...</A>`` answer if there is one, else the last ``Answer: x`` / ``answer is x``.

    A lenient extraction for models too small to follow the tag instruction (the tasks' ``style``
    ``"small"``). The phrase runs to the end of its sentence (``.``, ``,``, ``;``, ``!``, ``?``, a
    newline, a quote, ``*`` or a tag bracket) and is stripped. With ``whole_text``, a turn without
    either is its own answer (a leading ``"Name:"`` removed): F1 then gives partial credit to a
    turn that names the right entity among other words, and full credit only to a bare answer.

    Raises:
        ScoringError: If ``text`` is not a str.

    >>> extract_answer_phrase("Bob: the answer is Pimmelville. Thanks!")
    'Pimmelville'
    >>> extract_answer_phrase("Answer: **Kora Labs**")
    'Kora Labs'
    >>> extract_answer_phrase("The answer is:\\n\\nBath, Maine.")
    'Bath'
    >>> extract_answer_phrase("Answer: x <A>Lyon</A>")
    'Lyon'
    >>> extract_answer_phrase("no answer here") is None
    True
    >>> extract_answer_phrase("Bob: It is in Tesford, I think.", whole_text=True)
    'It is in Tesford, I think.'
    """
    check_str("extract_answer_phrase", "text", text)
    tagged = extract_tagged(text, "A")
    if tagged is not None:
        return tagged
    phrases = _ANSWER_PHRASE.findall(text)
    if phrases:
        return phrases[-1].strip()
    if whole_text:
        return _SPEAKER.sub("", text, count=1).strip() or None
    return None
