"""A griffe extension for the API reference: this project's docstrings as Markdown.

The docstrings are Google style with reST inline roles and bare doctests. Two rewrites make them
render (and keep ``mkdocs build --strict`` quiet) without touching the sources:

* a paragraph of doctest lines (``>>>``, ``...`` and their output) becomes a ``pycon`` code block
  (otherwise Markdown reads ``>>>`` as nested quotes and ``[x][y]`` output as a reference link);
* ``:func:`~a.b.c``` and the other roles become inline code (``c``, or ``a.b.c`` without ``~``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|attr|data|exc|obj|const|ref|term):`(~?)([^`]+)`")


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1]}`" if match.group(1) else f"`{target}`"


def _fence_doctests(text: str) -> str:
    out: list[str] = []
    block: list[str] = []
    fence = False
    for line in text.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("```"):
            fence = not fence
        if block:
            if stripped:
                block.append(line)
                continue
            out += ["```pycon", *block, "```"]
            block = []
        if not fence and stripped.startswith(">>>"):
            block = [line]
            continue
        out.append(line)
    if block:
        out += ["```pycon", *block, "```"]
    return "\n".join(out)


def markdown_docstring(text: str) -> str:
    """``text`` with doctest paragraphs fenced and reST roles turned into inline code."""
    return ROLE.sub(_role, _fence_doctests(text))


class MarkdownDocstrings(griffe.Extension):
    """Rewrite every docstring once it is read (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
