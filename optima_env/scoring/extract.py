"""Answer extraction from a turn's text: ``<A>...</A>`` tags and LaTeX ``\\boxed{...}``.

Both extractors run in linear time, also on pathological input such as 100,000 characters of
unclosed ``<A>`` or ``\\boxed{``, where the reference regexes would backtrack quadratically.
"""

from __future__ import annotations

import re

from optima_env.errors import ScoringError
from optima_env.scoring._validate import check_str

__all__ = ["extract_boxed", "extract_tagged"]

_BOX_OPENERS = re.compile(r"\\(?:boxed|fbox)\{")
_BRACES = re.compile(r"[{}]")
_TAG_NAME = re.compile(r"[^\s<>/]+")


def extract_tagged(text: str, tag: str = "A") -> str | None:
    """Return the stripped content of the last ``<tag>...</tag`` span on a single line.

    Same result as the reference ``re.findall(r"<A>(.*?)</A", text)[-1]`` (no DOTALL: the span
    cannot cross a newline; the closing ``>`` is optional), then stripped.

    Args:
        text: The turn text.
        tag: The tag name, ``"A"`` for answers.

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
    return None if last is None else last.strip()


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
