"""Where the test suite's time goes: by folder, by file, and by fixture.

Two parts. As a pytest plugin (loaded by ``tests/conftest.py``), ``--fixture-times PATH`` records
each fixture's setup time (its name, its scope and the node it was set up for) into ``PATH`` as JSON
lines, one file per xdist worker (``PATH.gw0``, ...). As a script, it reads a ``--durations=0`` log
and those files and prints the tables::

    python -m pytest --durations=0 --fixture-times /tmp/fixtures.jsonl > /tmp/pytest.log
    python -m tests.timings /tmp/pytest.log --fixtures /tmp/fixtures.jsonl

pytest's own ``--durations`` gives the setup, call and teardown of each test, and a session or
module fixture's cost lands in the setup of whichever test first asked for it; the fixture table
says which fixture that was.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["by_fixture", "by_folder", "main", "read_durations"]

_LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(.+?)\s*$")  # ids may hold spaces


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fixture-times",
        default=None,
        metavar="PATH",
        help="write each fixture's setup time to PATH (JSON lines; read by python -m tests.timings)",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Iterator[None]:
    path = request.config.getoption("--fixture-times")
    if not path:
        yield
        return
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    record = {"fixture": fixturedef.argname, "scope": fixturedef.scope, "seconds": round(seconds, 4),
              "node": request.node.nodeid}  # fmt: skip
    with open(f"{path}.{worker}" if worker else path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def read_durations(lines: Iterable[str]) -> list[tuple[float, str, str]]:
    """``(seconds, phase, node id)`` of each line of a ``--durations=0`` report."""
    out = []
    for line in lines:
        match = _LINE.match(line)
        if match:
            out.append((float(match.group(1)), match.group(2), match.group(3)))
    return out


def by_folder(durations: Iterable[tuple[float, str, str]]) -> dict[str, Counter]:
    """Seconds by test folder and by test file, each split by phase (and ``total``)."""
    folders: dict[str, Counter] = {}
    for seconds, phase, node in durations:
        file = node.split("::")[0]
        for key in (str(Path(file).parent), file):
            counter = folders.setdefault(key, Counter())
            counter[phase] += seconds
            counter["total"] += seconds
    return folders


def by_fixture(paths: Iterable[Path]) -> Counter:
    """Seconds of setup by ``fixture (scope)``, summed over every file (each worker's) given."""
    totals: Counter = Counter()
    for path in paths:
        candidates = [path] if path.is_file() else sorted(path.parent.glob(f"{path.name}.*"))
        for candidate in candidates:
            for line in candidate.read_text(encoding="utf-8").splitlines():
                record = json.loads(line)
                totals[f"{record['fixture']} ({record['scope']})"] += record["seconds"]
    return totals


def _table(title: str, rows: list[tuple[str, Counter | float]], limit: int) -> str:
    lines = [title]
    for name, value in rows[:limit]:
        if isinstance(value, Counter):
            phases = "  ".join(f"{p} {value[p]:7.1f}" for p in ("setup", "call", "teardown"))
            lines.append(f"{value['total']:8.1f} s  {phases}  {name}")
        else:
            lines.append(f"{value:8.1f} s  {name}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.timings", description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="pytest's output with --durations=0")
    parser.add_argument("--fixtures", type=Path, action="append", default=[],
                        help="a --fixture-times file (its per-worker siblings are read too)")  # fmt: skip
    parser.add_argument("--top", type=int, default=25, help="rows of the file and fixture tables")
    args = parser.parse_args(argv)
    durations = read_durations(args.log.read_text(encoding="utf-8").splitlines())
    if not durations:
        parser.error(f"{args.log} has no duration lines: run pytest with --durations=0")
    grouped = by_folder(durations)
    ranked = sorted(grouped.items(), key=lambda kv: -kv[1]["total"])
    folders = [(k, v) for k, v in ranked if not k.endswith(".py")]
    files = [(k, v) for k, v in ranked if k.endswith(".py")]
    total = sum(seconds for seconds, _, _ in durations)
    print(f"{len({n for _, _, n in durations})} tests, {total:.1f} s of setup, call and teardown "
          "(the wall time is shorter with workers)\n")  # fmt: skip
    print(_table("by folder:", folders, len(folders)) + "\n")
    print(_table(f"the {args.top} slowest files:", files, args.top))
    if args.fixtures:
        fixtures = by_fixture(args.fixtures).most_common(args.top)
        title = f"the {args.top} slowest fixtures (setup, summed over the tests that set them up):"
        print("\n" + _table(title, list(fixtures), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
