"""Blocks of the README that benchmark suites generate (between ``<!-- begin NAME -->`` markers).

``python -m benchmarks.run --suite demo|rollout|loop --update-readme`` rewrites its block from the
results it just wrote, so the README never carries a number that a script did not produce.
"""

from __future__ import annotations

from pathlib import Path

from optima_env.errors import DataError
from optima_env.io import read_text, write_text_atomic

__all__ = ["SUITES", "performance_block", "replace_block"]

REPO = Path(__file__).resolve().parents[2]
SUITES = {
    "rollout_engines": "The transformers engine, new against old (rollout suite, engine phases)",
    "loop": "Training loop per phase, new transformers engine against old (`--suite loop`)",
    "rollout": "Rollout throughput (`--suite rollout`)",
}
"""The suites' folders under ``benchmarks/results`` in block order, with their titles (the engine
comparisons come first: they are the newest measurements of the transformers engine; the
``rollout`` table was measured before it changed)."""


def replace_block(readme: Path, name: str, block: str) -> None:
    """Replace what lies between ``<!-- begin name -->`` and ``<!-- end name -->`` with ``block``."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    text = read_text(readme)
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise DataError(f"{readme}: expected the markers {begin!r} and {end!r} (in that order); add them")
    write_text_atomic(readme, f"{text[: start + len(begin)]}\n{block.rstrip()}\n{text[stop:]}")


def performance_block(folders: dict[str, Path]) -> str:
    """The README's performance block: each suite's ``results.md`` as its script wrote it, with the
    command that produced it (``command.txt`` beside it) and a link to its files."""
    parts = []
    for suite, title in SUITES.items():
        folder = folders.get(suite)
        if folder is None or not (folder / "results.md").is_file():
            parts.append(f"**{title}**: not run yet.\n")
            continue
        try:
            link = folder.resolve().relative_to(REPO).as_posix()
        except ValueError:
            link = str(folder)
        command = read_text(folder / "command.txt").strip() if (folder / "command.txt").is_file() else ""
        parts.append(
            f"**{title}**, from [`{link}/results.md`]({link}/results.md)"
            + (f" (`{command}`):" if command else ":")
        )
        parts.append("")
        parts.append(read_text(folder / "results.md").strip())
        parts.append("")
    return "\n".join(parts)
