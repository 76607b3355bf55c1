"""Small helpers shared by the row converters."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from optima_env.datasets.files import RowRef

__all__ = ["ID_FIELDS", "sample_id", "str_list", "unique"]

ID_FIELDS = ("id", "_id", "question_id", "unique_id")
"""Row fields tried, in order, for a sample id."""


def sample_id(row: Mapping[str, Any], default: str) -> str:
    """The row's own id (the first non-empty of :data:`ID_FIELDS`), else ``default``.

    ``default`` is ``<dataset>-<split>-<line>`` (the file line, or the row number for hub data).
    """
    for name in ID_FIELDS:
        value = row.get(name)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value) != "":
            return str(value)
    return default


def unique(values: Iterable[str]) -> tuple[str, ...]:
    """``values`` without duplicates (first occurrence kept) and without empty strings."""
    return tuple(dict.fromkeys(v for v in values if v != ""))


def str_list(value: Any, ref: RowRef, field: str) -> list[str]:
    """``value`` checked to be a list of strings; errors name ``field[i]``."""
    ref.check(value, list, field)
    for i, item in enumerate(value):
        ref.check(item, str, f"{field}[{i}]")
    return value
