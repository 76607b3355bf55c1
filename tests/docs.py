"""The documentation as tests read it: the README (the landing page) and the site's pages under
``docs/``, their sections and their code blocks."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"


def pages() -> list[Path]:
    """The README and every Markdown page of the site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def section(path: Path, title: str) -> str:
    """The body of the section headed ``title`` (any level from ``#`` to ``###``) of ``path``, up to
    the next heading of those levels (a ``#`` line inside a code block is no heading)."""
    body: list[str] | None = None
    fence = False
    for line in text(path).splitlines(keepends=True):
        heading = not fence and re.match(r"#{1,3} ", line)
        if line.startswith("```"):
            fence = not fence
        if heading and body is not None:
            break
        if body is not None:
            body.append(line)
        elif heading and line.split(" ", 1)[1].rstrip("\n") == title:
            body = []
    assert body is not None, f"no section {title!r} in {path.relative_to(REPO_ROOT)}"
    return "".join(body)


def code_blocks(markdown: str, language: str) -> list[str]:
    """The fenced blocks of ``language`` in ``markdown``, each without its fences."""
    return re.findall(rf"(?m)^```{language}\n(.*?)^```", markdown, re.DOTALL)


def code_block(path: Path, title: str, contains: str, language: str = "python") -> str:
    """The first ``language`` block of section ``title`` of ``path`` that contains ``contains``."""
    blocks = [b for b in code_blocks(section(path, title), language) if contains in b]
    assert blocks, f"no {language} block with {contains!r} in {path.relative_to(REPO_ROOT)}, {title!r}"
    return blocks[0]
