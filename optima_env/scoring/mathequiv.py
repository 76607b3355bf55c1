"""MATH answer equivalence with a hard timeout, built on ``math_verify``.

``math_verify``'s own timeouts use ``signal.alarm``: they work only in the main thread and
cannot stop work done in C (``9^{9^{9^9}}`` hangs sympy for hours). So the symbolic check runs
in one reused worker *process* (``_math_worker.py``, started on first use with
``sys.executable``, talking JSON lines over pipes). A request that runs past ``timeout`` seconds
gets the worker killed and counts as "not equal"; the next call starts a fresh worker. Calls
are serialized by a lock (thread-safe, one symbolic check at a time per process); a forked child
starts its own worker. Input text is only ever parsed, never evaluated.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from optima_env.errors import MissingDependencyError, ScoringError
from optima_env.scoring._validate import check_optional_str, check_str
from optima_env.scoring.extract import extract_boxed
from optima_env.scoring.math_norm import normalize_math_answer

__all__ = ["MAX_VERIFY_CHARS", "math_equal"]

#: Answers longer than this (after extraction and normalization) skip the symbolic check and
#: are compared as normalized strings only; no MATH answer comes close.
MAX_VERIFY_CHARS = 2000

_WORKER_SCRIPT = Path(__file__).with_name("_math_worker.py")
_STARTUP_TIMEOUT_S = 120.0
_SOFT_BUDGET_SHARE = 0.8
_PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def math_equal(prediction: str | None, gold: str, *, timeout: float = 5.0) -> bool:
    """Decide whether a predicted MATH answer is equivalent to the gold answer.

    Steps: take the content of the last balanced ``\\boxed{}`` of each side when there is one;
    normalize both with :func:`normalize_math_answer`; equal strings (or equal plain numbers,
    ``0.50`` vs ``.5``) are equal. Otherwise ``math_verify`` parses both, as the normalized
    strings and as the raw ones, wrapped in ``$...$``, and checks symbolic or numeric
    equivalence (``\\frac{1}{2}`` vs ``0.5``, ``x=3`` vs ``3``, ``(x+1)^2`` vs ``x^2+2x+1``).

    Args:
        prediction: The predicted answer (or a turn with a ``\\boxed{}``); ``None`` is False.
        gold: The gold answer (or a reference solution with a ``\\boxed{}``).
        timeout: Seconds the symbolic check may take (not counting the worker's one-time
            start); past it the answer counts as not equal.

    Returns:
        Whether the answers are equivalent. Empty answers are never equal to anything.

    Raises:
        ScoringError: On wrong argument types, a non-positive ``timeout``, or a worker that
            fails to start.
        MissingDependencyError: If ``math_verify`` is not installed.

    Example:
        ``math_equal(r"\\boxed{\\frac{1}{2}}", "0.5")`` is True; ``math_equal("5 dollars", "5")``
        is True (units are normalized away).
    """
    prediction = check_optional_str("math_equal", "prediction", prediction)
    check_str("math_equal", "gold", gold)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not (math.isfinite(timeout) and timeout > 0)
    ):
        raise ScoringError(
            f"math_equal: expected timeout to be a positive number of seconds, got {timeout!r}; "
            f"pass e.g. timeout=5.0"
        )
    if prediction is None:
        return False
    pred_raw, gold_raw = _core(prediction), _core(gold)
    pred_norm, gold_norm = normalize_math_answer(pred_raw), normalize_math_answer(gold_raw)
    if not pred_norm or not gold_norm:
        return False
    if pred_norm == gold_norm or _same_number(pred_norm, gold_norm):
        return True
    candidates = [(pred_norm, gold_norm), (pred_raw.strip(), gold_raw.strip())]
    pairs: list[list[str]] = []
    for pred_text, gold_text in candidates:
        pair = [_wrap(pred_text), _wrap(gold_text)]
        if max(len(pred_text), len(gold_text)) <= MAX_VERIFY_CHARS and pair not in pairs:
            pairs.append(pair)
    return bool(pairs) and _WORKER.equal(pairs, float(timeout))


def _core(text: str) -> str:
    boxed = extract_boxed(text)
    return text if boxed is None else boxed


def _wrap(text: str) -> str:
    return text if "$" in text else f"${text}$"


def _same_number(a: str, b: str) -> bool:
    if not (_PLAIN_NUMBER.fullmatch(a) and _PLAIN_NUMBER.fullmatch(b)):
        return False
    return Decimal(a) == Decimal(b)


class _MathWorker:
    """A lazily started, reused ``math_verify`` process; killed when a request overruns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._replies: queue.Queue[dict[str, Any] | None] | None = None
        self._owner_pid = -1
        self._next_id = 0

    def equal(self, pairs: list[list[str]], timeout: float) -> bool:
        with self._lock:
            proc, replies = self._ensure_started()
            self._next_id += 1
            request_id = self._next_id
            request = {"id": request_id, "pairs": pairs, "budget": timeout * _SOFT_BUDGET_SHARE}
            deadline = time.monotonic() + timeout
            try:
                stdin = proc.stdin
                if stdin is None:
                    raise OSError("worker has no stdin")
                stdin.write(json.dumps(request) + "\n")
                stdin.flush()
            except (OSError, ValueError):
                self._stop()
                return False
            while True:
                try:
                    reply = replies.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    reply = None
                if reply is None:  # timed out, or the worker died
                    self._stop()
                    return False
                if reply.get("id") == request_id:
                    return bool(reply.get("equal"))

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _ensure_started(self) -> tuple[subprocess.Popen[str], queue.Queue[dict[str, Any] | None]]:
        if self._proc is not None and self._owner_pid != os.getpid():
            self._proc = self._replies = None  # inherited through fork: the parent's worker
        if self._proc is not None and self._proc.poll() is not None:
            self._stop()
        if self._proc is None or self._replies is None:
            return self._start()
        return self._proc, self._replies

    def _start(self) -> tuple[subprocess.Popen[str], queue.Queue[dict[str, Any] | None]]:
        if importlib.util.find_spec("math_verify") is None:
            raise MissingDependencyError(
                "math_equal needs 'math_verify', which is not installed; install it with "
                "`pip install math-verify` (a core dependency of optima)"
            )
        proc = subprocess.Popen(  # fixed argv: this interpreter, our script
            [sys.executable, "-u", str(_WORKER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )
        replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, replies), daemon=True).start()
        self._proc, self._replies, self._owner_pid = proc, replies, os.getpid()
        try:
            ready = replies.get(timeout=_STARTUP_TIMEOUT_S)
        except queue.Empty:
            ready = None
        if not ready or not ready.get("ready"):
            self._stop()
            raise ScoringError(
                f"math_equal: expected the math_verify worker to start within "
                f"{_STARTUP_TIMEOUT_S:.0f} s, but it exited or hung; check that "
                f"`{sys.executable} -c 'import math_verify'` works"
            )
        return proc, replies

    def _stop(self) -> None:
        proc, self._proc, self._replies = self._proc, None, None
        if proc is None or self._owner_pid != os.getpid():
            return
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - kill is not refused on POSIX
            pass
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:  # pragma: no cover
                pass


def _pump(stream: IO[str] | None, replies: queue.Queue[dict[str, Any] | None]) -> None:
    try:
        for line in stream or ():
            try:
                replies.put(json.loads(line))
            except ValueError:
                continue
    except (OSError, ValueError):
        pass
    replies.put(None)


_WORKER = _MathWorker()
atexit.register(_WORKER.close)
