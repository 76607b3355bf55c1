"""Files: JSONL episodes and atomically written JSON/text results.

Appends are flushed and fsync'ed line by line, so a crash loses at most the line being written;
:func:`read_episodes` reports a torn last line instead of failing on it, and any other bad line
as a :class:`~optima_env.errors.DataError` naming the file and line.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from optima_env.errors import DataError
from optima_env.types import Episode

__all__ = [
    "append_jsonl",
    "read_episodes",
    "read_json_object",
    "read_jsonl",
    "read_text",
    "write_episodes",
    "write_json_atomic",
    "write_text_atomic",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _umask() -> int:
    """The process's umask (read from /proc where it can be, so no other thread sees it change)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)  # briefly the strictest mask, never a looser one
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, then rename it into place.

    The file gets the mode a plain ``open(path, "w")`` would give it (``0o666`` minus the umask),
    not the ``0o600`` of :func:`tempfile.mkstemp`, so a group sharing a results folder can read it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON."""
    write_text_atomic(path, _dumps(obj, indent=2) + "\n")


def append_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> None:
    """Append records as JSON lines, flushed and fsync'ed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        for record in records:
            handle.write(_dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def write_episodes(path: str | os.PathLike[str], episodes: Iterable[Episode]) -> None:
    """Atomically write episodes as JSONL (replacing the file)."""
    write_text_atomic(path, "".join(_dumps(e.to_dict()) + "\n" for e in episodes))


def _dumps(obj: Any, **kwargs: Any) -> str:
    """JSON text with non-ASCII characters kept as they are, except when the text holds a lone
    surrogate (which UTF-8 cannot encode): then JSON's ``\\u`` escapes, which read back the same."""
    text = json.dumps(obj, ensure_ascii=False, **kwargs)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, **kwargs)
    return text


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file's content; :class:`DataError` names the file and the line of the first
    bytes that are not UTF-8 (or why the file cannot be opened)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read the file ({exc.strerror or exc})") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        bad = data[exc.start : exc.start + 4]
        raise DataError(
            f"{path}, line {line}: bytes that are not UTF-8 ({bad!r}); the file is corrupt: "
            "delete or repair it"
        ) from exc


def read_json_object(path: str | os.PathLike[str], *, fix: str = "delete or repair it") -> dict[str, Any]:
    """A JSON file holding one object (``config.json``, ``result.json``, ...).

    Raises :class:`DataError` naming the file (and the line, for bytes that are not UTF-8 and for
    invalid or truncated JSON) when it is unreadable, empty, not JSON or not an object; ``fix``
    says what to do about it.
    """
    text = read_text(path)
    if not text.strip():
        raise DataError(f"{path}: empty file; {fix}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        cut = "" if text.rstrip().endswith("}") else ", the file looks truncated"
        raise DataError(
            f"{path}, line {exc.lineno}, column {exc.colno}: invalid JSON ({exc.msg}{cut}); {fix}"
        ) from exc
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(data).__name__}; {fix}")
    return data


def read_jsonl(
    path: str | os.PathLike[str],
    parse: Callable[[Any], T] = lambda record: record,
    *,
    torn_tail: bool = True,
    fix: str = "delete or repair that line",
) -> list[T]:
    """The records of a JSONL file, each passed through ``parse`` (the one JSONL reader).

    With ``torn_tail`` (files appended line by line), a bad final line with no newline after it
    (a crash mid-append) is skipped with a warning. Any other bad line (invalid JSON, or
    ``parse`` raising :class:`DataError`, ``KeyError``, ``TypeError`` or ``ValueError``) and bytes
    that are not UTF-8 raise :class:`DataError` naming the file and the line; ``fix`` says what to
    do about it.
    """
    path = Path(path)
    lines = read_text(path).split("\n")
    out: list[T] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(parse(json.loads(line)))
        except (json.JSONDecodeError, DataError, KeyError, TypeError, ValueError) as exc:
            if torn_tail and i == len(lines) - 1:  # no newline after it: the append was interrupted
                logger.warning("%s:%d: skipping a torn last line (interrupted write)", path, i + 1)
                continue
            raise DataError(f"{path}, line {i + 1}: not a valid record: {exc}; {fix}") from exc
    return out


def read_episodes(path: str | os.PathLike[str]) -> list[Episode]:
    """Read a JSONL file of episodes (an empty file holds none).

    A torn final line (a crash mid-append: no newline after it) is skipped with a warning; a bad
    line anywhere else (invalid JSON, a missing, unknown or mistyped field), and bytes that are
    not UTF-8, raise :class:`DataError` naming file, line and field.
    """
    return read_jsonl(path, Episode.from_dict, fix="the file is corrupt: delete it to regenerate")
