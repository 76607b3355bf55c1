"""The worker process behind :func:`optima_env.scoring.math_equal` (run as a script).

It imports ``math_verify`` once, prints ``{"ready": true}``, then answers JSON lines
``{"id": n, "pairs": [[prediction, gold], ...], "budget": seconds}`` with
``{"id": n, "equal": bool}``: true as soon as one pair verifies. The budget is a soft limit
(``SIGALRM``, where available); the parent kills the process when a request runs past its hard
timeout, which also covers work that a signal cannot interrupt (huge integer powers in C).
Nothing here evaluates its input as code: ``math_verify`` parses LaTeX into sympy objects.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, TextIO

__all__ = ["main"]


class _Timeout(BaseException):
    """Raised by the alarm; a BaseException so that broad ``except Exception`` cannot eat it."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _Timeout


def _send(stream: TextIO, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def _any_equal(pairs: list[list[str]], parse: Any, verify: Any) -> bool:
    for prediction, gold in pairs:
        try:
            gold_parsed = parse(gold, parsing_timeout=None)
            pred_parsed = parse(prediction, parsing_timeout=None)
            if not (gold_parsed and pred_parsed):
                continue
            if verify(gold_parsed, pred_parsed, timeout_seconds=None):
                return True
        except Exception:  # any failure to parse or compare means "not equal"
            continue
    return False


def main() -> int:
    """Serve requests on stdin until it closes."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    protocol, sys.stdout = sys.stdout, sys.stderr  # stray prints must not break the protocol
    import logging
    import warnings

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from math_verify import parse, verify

    can_alarm = hasattr(signal, "setitimer")
    if can_alarm:
        signal.signal(signal.SIGALRM, _on_alarm)
    _send(protocol, {"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        equal = False
        try:
            try:
                if can_alarm:
                    signal.setitimer(signal.ITIMER_REAL, max(0.01, float(request["budget"])))
                equal = _any_equal(request["pairs"], parse, verify)
            finally:
                if can_alarm:
                    signal.setitimer(signal.ITIMER_REAL, 0)
        except _Timeout:
            equal = False
        _send(protocol, {"id": request["id"], "equal": equal})
    return 0


if __name__ == "__main__":
    sys.exit(main())
