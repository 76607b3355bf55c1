"""The committed results stay within a size budget: the files git tracks under benchmarks/results.

Untracked files there are run leftovers (checkpoints, trees of a local run) and do not count. The
size of a tracked file is its blob's in the index (``git ls-files -s`` then ``git cat-file``), so a
file staged for the next commit counts and a local edit does not.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.helpers import REPO_ROOT

RESULTS = "benchmarks/results"
BUDGET_BYTES = 250 * 2**20
"""Just above the tracked size when the budget was set (247.5 MiB); raise it only with a reason."""


def tracked_sizes(folder: str = RESULTS) -> dict[str, int]:
    """Path -> size in bytes of every file git tracks under ``folder`` (index blobs)."""
    listing = subprocess.run(
        ["git", "ls-files", "-s", "-z", "--", folder], cwd=REPO_ROOT, check=True, capture_output=True
    ).stdout.decode()
    entries = [line.split("\t", 1) for line in listing.split("\0") if line]
    paths = [path for _, path in entries]
    blobs = "".join(meta.split()[1] + "\n" for meta, _ in entries)
    sizes = subprocess.run(
        ["git", "cat-file", "--batch-check=%(objectsize)"],
        cwd=REPO_ROOT, input=blobs.encode(), check=True, capture_output=True,
    ).stdout.split()  # fmt: skip
    return dict(zip(paths, (int(s) for s in sizes), strict=True))


def over_budget(sizes: dict[str, int], budget: int) -> str | None:
    """The failure message when ``sizes`` sum to more than ``budget``, else ``None``.

    >>> over_budget({"a": 3, "b": 2}, 10) is None
    True
    """
    total = sum(sizes.values())
    if total <= budget:
        return None
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    listed = ", ".join(f"{path} ({size / 2**20:.1f} MiB)" for path, size in largest)
    return (
        f"{RESULTS} holds {total / 2**20:.1f} MiB of tracked files, over its budget of "
        f"{budget / 2**20:.1f} MiB; the largest: {listed}. Untrack or shrink what is not evidence "
        f"(git rm --cached keeps the file), or raise BUDGET_BYTES in {__name__} with the reason"
    )


NO_GIT = shutil.which("git") is None or not (REPO_ROOT / ".git").exists()


@pytest.mark.skipif(NO_GIT, reason="no git checkout")
def test_the_tracked_results_fit_their_size_budget() -> None:
    sizes = tracked_sizes()
    assert sizes, f"git tracks no file under {RESULTS}"
    message = over_budget(sizes, BUDGET_BYTES)
    assert message is None, message


def test_the_budget_message_names_the_total_the_budget_and_the_largest_files() -> None:
    message = over_budget({f"{RESULTS}/a.bin": 3 * 2**20, f"{RESULTS}/b.json": 2**20}, 2**20)
    assert message is not None
    assert message.startswith(f"{RESULTS} holds 4.0 MiB of tracked files, over its budget of 1.0 MiB")
    assert f"{RESULTS}/a.bin (3.0 MiB), {RESULTS}/b.json (1.0 MiB)" in message
    assert "BUDGET_BYTES" in message
