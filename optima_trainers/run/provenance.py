"""The git commit a run or an export records, so a reader can check out the code that made it.

One place for it: ``python -m optima_trainers.cli.export`` writes it into an adapter's manifest and
``python -m benchmarks.run`` into every ``results.json`` and the demo's manifests.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["git_commit"]


def git_commit(root: Path, *, ignore: tuple[str, ...] = ()) -> str | None:
    """HEAD's commit of the checkout at ``root``, ending in ``-dirty`` when a tracked file differs
    from it (the commit then does not hold the code that ran), or ``None`` outside a checkout.

    ``ignore`` lists path prefixes, relative to the checkout's top, whose changes do not count:
    files a run writes itself (its results, a README block it regenerates).
    """
    commands = (["git", "rev-parse", "HEAD"], ["git", "status", "--porcelain", "--untracked-files=no"])
    try:
        head, status = (
            subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=10, cwd=root).stdout
            for cmd in commands
        )
    except (OSError, subprocess.SubprocessError):
        return None
    changed = [line[3:].split(" -> ")[-1] for line in status.splitlines() if line.strip()]
    dirty = any(not path.startswith(ignore) for path in changed)  # startswith(()) is False
    return head.strip() + ("-dirty" if dirty else "")
