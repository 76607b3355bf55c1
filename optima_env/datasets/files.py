"""Reading dataset files and checking row fields, with errors that say where and what.

Every error is a :class:`~optima_env.errors.DataError` whose message names the file (or hub
dataset), the line (or array item / hub row) and, for field errors, the field::

    /data/gsm8k/test.jsonl, line 2: invalid JSON (Unterminated string ...); is the line truncated?
    /data/arc_challenge/test.jsonl, line 7: field 'choices': expected dict, got str
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optima_env.errors import DataError

__all__ = [
    "DATA_DIR_ENV",
    "RowRef",
    "read_jsonl",
    "read_records",
    "require_field",
    "resolve_data_dir",
    "type_name",
]

logger = logging.getLogger(__name__)

DATA_DIR_ENV = "OPTIMA_DATA_DIR"
"""Environment variable naming the data folder when no ``data_dir`` is passed."""


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The data folder to read local datasets from.

    Args:
        data_dir: An explicit folder; wins over the environment.

    Returns:
        ``data_dir`` if given, else the folder named by ``OPTIMA_DATA_DIR`` if set and non-empty,
        else ``None`` (no local data: loaders fall back to the Hugging Face hub).

    Raises:
        DataError: The folder given (by argument or environment) does not exist or is not a folder.
    """
    origin = "data_dir"
    if data_dir is None or str(data_dir) == "":
        data_dir = os.environ.get(DATA_DIR_ENV) or None
        origin = DATA_DIR_ENV
    if data_dir is None:
        return None
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a folder"
        raise DataError(
            f"the data folder {str(path)!r} (from {origin}) {what}; point --data-dir / "
            f"{DATA_DIR_ENV} at a folder holding <dataset>/<split>.jsonl files, or unset it"
        )
    return path


@dataclass(frozen=True, slots=True)
class RowRef:
    """Where a row came from: ``path`` (a file, or ``hub <name>``), its 1-based ``line`` and the
    ``unit`` that number counts (``line`` of a JSONL file, ``item`` of a JSON array, hub ``row``).
    """

    path: str
    line: int
    unit: str = "line"

    def __str__(self) -> str:
        return f"{self.path}, {self.unit} {self.line}"

    def error(self, message: str, field: str | None = None) -> DataError:
        """A :class:`DataError` located at this row (and ``field``, when given)."""
        where = f"{self}: field {field!r}" if field else str(self)
        return DataError(f"{where}: {message}")

    def get(
        self, row: Mapping[str, Any], name: str, type_: type | tuple[type, ...], *, nullable: bool = False
    ) -> Any:
        """``row[name]``, checked to be of ``type_`` (see :func:`require_field`)."""
        return require_field(
            row, name, type_, path=self.path, line=self.line, unit=self.unit, nullable=nullable
        )

    def check(self, value: Any, type_: type | tuple[type, ...], field: str) -> Any:
        """``value`` if it is of ``type_``, else raise naming ``field`` (e.g. ``context[2]``)."""
        if not _is_instance(value, type_):
            raise self.error(f"expected {_expected(type_)}, got {type_name(value)}", field)
        return value


def type_name(value: Any) -> str:
    """The Python type name of ``value`` as error messages show it (``None`` for null)."""
    return "None" if value is None else type(value).__name__


def _is_instance(value: Any, type_: type | tuple[type, ...]) -> bool:
    types = type_ if isinstance(type_, tuple) else (type_,)
    if isinstance(value, bool) and bool not in types:  # a JSON true is not a number here
        return False
    return isinstance(value, types)


def _expected(type_: type | tuple[type, ...]) -> str:
    types = type_ if isinstance(type_, tuple) else (type_,)
    return " or ".join(t.__name__ for t in types)


def require_field(
    row: Mapping[str, Any],
    name: str,
    type_: type | tuple[type, ...],
    *,
    path: str | os.PathLike[str],
    line: int,
    unit: str = "line",
    nullable: bool = False,
) -> Any:
    """``row[name]``, checked to exist and be of ``type_``.

    Args:
        row: One record.
        name: The field to read.
        type_: The accepted type(s); ``bool`` never passes for ``int``/``float``.
        path: The file (or hub dataset) the row came from, for the message.
        line: The row's 1-based line (or item / row number), for the message.
        unit: What ``line`` counts: ``line``, ``item`` or ``row``.
        nullable: Also accept ``None`` (returned as is).

    Returns:
        The field's value.

    Raises:
        DataError: The field is missing (``... field 'x': missing; the row has fields [...]``) or of
            the wrong type (``... field 'x': expected list, got str``).
    """
    ref = RowRef(str(path), line, unit)
    if name not in row:
        raise ref.error(f"missing; the row has fields {sorted(row)}", name)
    value = row[name]
    if value is None and nullable:
        return None
    return ref.check(value, type_, name)


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, record)`` for each non-blank line of a JSON Lines file.

    Line numbers are 1-based and count blank lines, so they match an editor's. A UTF-8 byte-order
    mark on the first line is ignored.

    Raises:
        DataError: The file is missing, a line is not UTF-8, not valid JSON (e.g. truncated) or not
            a JSON object, or the file holds no rows at all. The message names file and line.
    """
    path = Path(path)
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot open the file ({exc.strerror or exc})") from exc
    count = 0
    with handle:
        for number, raw in enumerate(handle, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = raw[exc.start : exc.start + 4]
                raise DataError(
                    f"{path}, line {number}: bytes that are not UTF-8 at byte {exc.start + 1} of "
                    f"the line ({bad!r}); re-encode the file as UTF-8"
                ) from exc
            if number == 1:
                text = text.removeprefix("\ufeff")
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{path}, line {number}: invalid JSON ({exc.msg} at column {exc.colno}); "
                    f"is the line truncated?"
                ) from exc
            if not isinstance(record, dict):
                raise DataError(f"{path}, line {number}: expected a JSON object, got {type_name(record)}")
            count += 1
            yield number, record
    if count == 0:
        raise DataError(f"{path}: no rows (the file is empty or holds only blank lines)")


def read_records(path: str | os.PathLike[str]) -> Iterator[tuple[RowRef, dict[str, Any]]]:
    """Yield ``(where, record)`` from a JSON Lines file or a file holding one JSON array of objects.

    The original 2WikiMultihopQA release (``dev.json``, ``train.json``) is a JSON array; normalized
    copies are JSON Lines. The format is told by the first non-blank character (``[`` = array).

    Raises:
        DataError: As :func:`read_jsonl`; for arrays, an item that is not an object names its
            1-based item number, and invalid JSON names the line and column.
    """
    path = Path(path)
    if not _starts_with_bracket(path):
        for number, record in read_jsonl(path):
            yield RowRef(str(path), number), record
        return
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}, line {line}: bytes that are not UTF-8; re-encode the file as UTF-8"
        ) from exc
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{path}, line {exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno}); "
            f"is the file truncated?"
        ) from exc
    if not isinstance(items, list) or not items:
        what = "an empty array" if isinstance(items, list) else type_name(items)
        raise DataError(f"{path}: no rows (expected a JSON array of objects, got {what})")
    for number, record in enumerate(items, 1):
        ref = RowRef(str(path), number, "item")
        if not isinstance(record, dict):
            raise ref.error(f"expected a JSON object, got {type_name(record)}")
        yield ref, record


def _starts_with_bracket(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
    except OSError as exc:
        raise DataError(f"{path}: cannot open the file ({exc.strerror or exc})") from exc
    return head.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] == b"["
