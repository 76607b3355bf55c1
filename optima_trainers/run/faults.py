"""Fault injection for crash-and-resume tests: die by SIGKILL at a named point.

Set ``OPTIMA_FAULT=<point>:<n>`` and the process kills itself (SIGKILL, no cleanup, exactly like
an external ``kill -9``) at the n-th time it reaches ``point``:

* ``episode``: after an episode is appended to its file;
* ``train_step``: after an optimizer step;
* ``checkpoint``: after the weights are saved, before the ``COMPLETE`` marker;
* ``mcts_tree``: after a finished tree is appended to its stage's trees file;
* ``phase``: after a phase of a stage is recorded.

``<point>:<n>@<rank>`` kills only the process of that rank (``RANK``: one process of a
multi-process run). Without the variable every call is a no-op.
"""

from __future__ import annotations

import os
import signal

__all__ = ["FAULT_ENV", "fault_point"]

FAULT_ENV = "OPTIMA_FAULT"
_hits: dict[str, int] = {}


def fault_point(name: str) -> None:
    """SIGKILL this process if ``$OPTIMA_FAULT`` names ``name`` and its count is reached."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    point, _, count = spec.partition(":")
    count, _, rank = count.partition("@")
    if point != name or (rank and rank != os.environ.get("RANK", "0")):
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
