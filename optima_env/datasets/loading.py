"""``load_samples``: one call that reads any dataset split from local JSONL or the hub.

Resolution order (``source="auto"``): a path passed as ``hf_name`` (explicit wins); else
``<data_dir>/<dataset>/<file>`` when a data folder resolves (argument, then ``OPTIMA_DATA_DIR``) and
one of the split's files exists; else the Hugging Face hub via ``datasets.load_dataset`` (the
optional ``optima[train]`` extra, imported only here). When neither works, one :class:`DataError`
names both options and why each failed.

Nothing is dropped silently: rows that do not convert raise :class:`DataError`. The only rows
ever left out are the MMLU ``train`` rows whose question is also in ARC-Challenge train (spec
§2.2); their count is logged (INFO, logger ``optima_env.datasets.loading``) and returned in
:attr:`LoadReport.dropped` by :func:`load_samples_with_report`.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from optima_env.datasets.files import DATA_DIR_ENV, RowRef, read_records, resolve_data_dir
from optima_env.datasets.sources import (
    DATASETS,
    DatasetSpec,
    HubSource,
    SplitSpec,
    get_spec,
    parse_hub_name,
)
from optima_env.errors import DataError, require
from optima_env.types import TaskSample

__all__ = [
    "ARC_OVERLAP",
    "MMLU_SHUFFLE_SEED",
    "LoadReport",
    "Source",
    "list_datasets",
    "list_splits",
    "load_samples",
    "load_samples_with_report",
]

logger = logging.getLogger(__name__)

Source = Literal["auto", "local", "hf"]
MMLU_SHUFFLE_SEED = 42
"""Seed of the ``random.Random`` that shuffles MMLU ``train`` (the reference code's)."""
ARC_OVERLAP = "question_in_arc_challenge_train"
"""The :attr:`LoadReport.dropped` key counting MMLU ``train`` rows removed for ARC overlap."""

_Rows = Iterator[tuple[RowRef, Mapping[str, Any], str]]


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What one load read, from where, and what (if anything) it left out and why."""

    dataset: str
    split: str
    origin: str
    """The file read, or ``hub <name>:<config> [<split>]``."""
    rows_read: int
    """Rows read and converted (stops early under ``limit``, except for MMLU ``train``)."""
    samples: int
    """Samples returned."""
    dropped: Mapping[str, int] = field(default_factory=dict)
    """Rows left out, by reason (only :data:`ARC_OVERLAP` exists)."""


def list_datasets() -> list[str]:
    """The dataset ids :func:`load_samples` knows, sorted."""
    return list(DATASETS)


def list_splits(dataset: str) -> list[str]:
    """The splits of ``dataset`` (``train`` and ``test`` always; ``test`` = the spec §8.1 set)."""
    return list(get_spec(dataset).splits)


def load_samples(
    dataset: str,
    split: str,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    source: Source = "auto",
    limit: int | None = None,
    hf_name: str | None = None,
    require_context: bool = True,
    filter_arc: bool = True,
) -> list[TaskSample]:
    """Load ``split`` of ``dataset`` as :class:`TaskSample` records, in file (or hub) order.

    Args:
        dataset: One of :func:`list_datasets`.
        split: One of :func:`list_splits`; ``test`` is the evaluation split of spec §8.1.
        data_dir: The data folder (holds ``<dataset>/<file>.jsonl``); default ``OPTIMA_DATA_DIR``.
        source: ``auto`` (local, else hub), ``local`` or ``hf`` (hub only).
        limit: Return at most this many samples (the first ones; for MMLU ``train`` the first
            after filtering and shuffling).
        hf_name: Hub dataset to use instead of the default, ``name`` or ``name:config[,config]``
            (``name:`` = no config); or a path to a file (JSON array or JSONL) or a folder holding
            the split's files, e.g. the original 2WikiMultihopQA release.
        require_context: 2WikiMultihopQA / TriviaQA only: raise on rows without contexts (the
            question-only copies); ``False`` loads them with an empty context.
        filter_arc: MMLU ``train`` only: remove auxiliary questions that are in ARC-Challenge
            train (spec §2.2, §13.17); ``False`` skips the filter (no ARC data needed).

    Returns:
        The samples (see :func:`load_samples_with_report` for counts and drops).

    Raises:
        DataError: Unknown dataset / split, no usable source, or a malformed row (the message
            names file, line and field).
    """
    samples, _ = load_samples_with_report(
        dataset,
        split,
        data_dir=data_dir,
        source=source,
        limit=limit,
        hf_name=hf_name,
        require_context=require_context,
        filter_arc=filter_arc,
    )
    return samples


def load_samples_with_report(
    dataset: str,
    split: str,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    source: Source = "auto",
    limit: int | None = None,
    hf_name: str | None = None,
    require_context: bool = True,
    filter_arc: bool = True,
) -> tuple[list[TaskSample], LoadReport]:
    """As :func:`load_samples`, also returning a :class:`LoadReport` (origin, counts, drops)."""
    spec = get_spec(dataset)
    split_spec = spec.split(split)
    if source not in ("auto", "local", "hf"):
        raise DataError(f"unknown source {source!r}; valid sources: auto, local, hf")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise DataError(f"limit must be a non-negative int or None, got {limit!r}")
    options = {"require_context": require_context} if spec.context_option else {}
    if spec.name == "mmlu" and split == "train":
        return _mmlu_train(spec, split_spec, data_dir, source, limit, hf_name, filter_arc)
    rows, origin = _open(spec, split, split_spec, data_dir, source, hf_name)
    samples = [spec.convert(row, ref, default_id, **options) for ref, row, default_id in islice(rows, limit)]
    report = LoadReport(spec.name, split, origin, len(samples), len(samples))
    logger.info("loaded %d %s/%s samples from %s", len(samples), spec.name, split, origin)
    return samples, report


def _mmlu_train(
    spec: DatasetSpec,
    split_spec: SplitSpec,
    data_dir: Any,
    source: Source,
    limit: int | None,
    hf_name: str | None,
    filter_arc: bool,
) -> tuple[list[TaskSample], LoadReport]:
    """MMLU ``train`` = ``auxiliary_train`` minus ARC-Challenge-train questions, shuffled (seed 42).

    Questions are compared after stripping surrounding whitespace. The reference code shuffles the
    kept rows with ``random.Random(42)``; so does this, so the order matches for the same rows.
    """
    rows, origin = _open(spec, "auxiliary_train", split_spec, data_dir, source, hf_name)
    samples = [spec.convert(row, ref, default_id) for ref, row, default_id in rows]
    dropped: dict[str, int] = {}
    if filter_arc:
        try:
            arc = load_samples("arc_challenge", "train", data_dir=data_dir, source=source)
        except DataError as exc:
            raise DataError(
                "mmlu 'train' is auxiliary_train minus the questions that are also in "
                "ARC-Challenge train (spec §2.2), and that filter needs ARC-Challenge train, which "
                f"could not be loaded: {exc} -- provide it, or pass filter_arc=False to skip it"
            ) from exc
        arc_questions = {s.question.strip() for s in arc}
        kept = [s for s in samples if s.question.strip() not in arc_questions]
        dropped[ARC_OVERLAP] = len(samples) - len(kept)
        logger.info(
            "mmlu/train: dropped %d of %d auxiliary_train rows (%s) whose question is also in "
            "ARC-Challenge train; %d remain",
            dropped[ARC_OVERLAP],
            len(samples),
            origin,
            len(kept),
        )
    else:
        kept = list(samples)
        logger.info("mmlu/train: ARC-Challenge filter disabled (filter_arc=False); %d rows kept", len(kept))
    random.Random(MMLU_SHUFFLE_SEED).shuffle(kept)
    out = kept[:limit] if limit is not None else kept
    return out, LoadReport(spec.name, "train", origin, len(samples), len(out), dropped)


# -- finding the rows ------------------------------------------------------------------------------
def _open(
    spec: DatasetSpec, split: str, split_spec: SplitSpec, data_dir: Any, source: Source, hf_name: str | None
) -> tuple[_Rows, str]:
    """The rows of one split and where they come from; raises the two-option error if nowhere."""
    override = _as_path(hf_name)
    if override is not None:
        path = override if override.is_file() else _first_file(override, split_spec.files)
        if path is None:
            raise DataError(
                f"hf_name folder {str(override)!r} holds none of the {spec.name} "
                f"{split!r} files {list(split_spec.files)}"
            )
        return _file_rows(spec, split, path), str(path)
    local_reason = "not tried (source='hf')"
    if source in ("auto", "local"):
        root = resolve_data_dir(data_dir)
        if root is None:
            local_reason = f"no data folder (neither data_dir nor {DATA_DIR_ENV} is set)"
        else:
            path = _first_file(root / spec.name, split_spec.files)
            if path is not None:
                return _file_rows(spec, split, path), str(path)
            local_reason = f"no {' / '.join(split_spec.files)} in {str(root / spec.name)!r}"
    hub = split_spec.hub
    if hub is not None and hf_name is not None:
        hub = parse_hub_name(hf_name, hub)
    if source == "local":
        raise _unavailable(spec, split_spec, hub, local_reason, "not tried (source='local')")
    if hub is None:
        raise _unavailable(spec, split_spec, None, local_reason, "no hub copy exists")
    try:
        datasets = require("datasets", "train")
        parts = [(config, datasets.load_dataset(hub.name, config, split=hub.split)) for config in hub.configs]
    except Exception as exc:  # any hub failure becomes the one two-option error
        raise _unavailable(spec, split_spec, hub, local_reason, f"{type(exc).__name__}: {exc}") from exc
    return _hub_rows(spec, split, hub, parts), f"hub {hub.describe()}"


def _as_path(hf_name: str | None) -> Path | None:
    if hf_name is None:
        return None
    path = Path(hf_name).expanduser()
    if path.exists():
        return path
    if hf_name.endswith((".json", ".jsonl")) or hf_name.startswith(("/", "./", "../", "~")):
        raise DataError(f"hf_name {hf_name!r} looks like a path but does not exist")
    return None


def _first_file(folder: Path, names: tuple[str, ...]) -> Path | None:
    return next((folder / n for n in names if (folder / n).is_file()), None)


def _file_rows(spec: DatasetSpec, split: str, path: Path) -> _Rows:
    for ref, row in read_records(path):
        yield ref, row, f"{spec.name}-{split}-{ref.line}"


def _hub_rows(spec: DatasetSpec, split: str, hub: HubSource, parts: list[tuple[Any, Any]]) -> _Rows:
    number = 0
    for config, data in parts:
        for row_number, row in enumerate(data, 1):
            number += 1
            yield hub.ref(config, row_number), row, f"{spec.name}-{split}-{number}"


def _unavailable(
    spec: DatasetSpec, split_spec: SplitSpec, hub: HubSource | None, local_reason: str, hub_reason: str
) -> DataError:
    local_fix = f"set --data-dir / {DATA_DIR_ENV} to a folder with {spec.name}/{split_spec.files[0]}"
    if hub is None:
        fix = f"{local_fix}; {spec.no_hub or 'this split has no hub copy'}"
    else:
        fix = (
            f"{local_fix}, or install `optima[train]` and allow network access to load "
            f"{hub.describe()} from the Hugging Face hub"
        )
    return DataError(f"cannot load {spec.name}: local data: {local_reason}; hub: {hub_reason}. To fix: {fix}")
