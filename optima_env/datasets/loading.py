"""``load_samples``: one call that reads any dataset split from local JSONL or the hub.

Resolution order (``source="auto"``): a path passed as ``hf_name`` (explicit wins); else
``<data_dir>/<dataset>/<file>`` when a data folder resolves (argument, then ``OPTIMA_DATA_DIR``) and
one of the split's files exists; else the Hugging Face hub via ``datasets.load_dataset`` (the
optional ``optima[train]`` extra, imported only here). When neither works, one :class:`DataError`
names both options and why each failed.

Nothing is dropped silently: rows that do not convert raise :class:`DataError`. The only rows
ever left out are the MMLU ``train`` rows whose question is also in ARC-Challenge train (spec
§2.2), and, when a split is a group of files (2WikiMultihopQA's local dev copy), the rows of a
later file whose question an earlier file already holds; their counts are logged (INFO, logger
``optima_env.datasets.loading``) and returned in :attr:`LoadReport.dropped` by
:func:`load_samples_with_report`.
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
    FileChoice,
    HubSource,
    SplitSpec,
    choice_name,
    get_spec,
    parse_hub_name,
)
from optima_env.errors import DataError, DataMissingError, require
from optima_env.types import TaskSample

__all__ = [
    "ARC_OVERLAP",
    "DUPLICATE_QUESTION",
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
DUPLICATE_QUESTION = "duplicate_question_in_earlier_file"
"""The :attr:`LoadReport.dropped` key counting rows of a file group whose question an earlier file
of the group holds (the earlier row is kept)."""

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
    """Rows left out, by reason (:data:`ARC_OVERLAP`, :data:`DUPLICATE_QUESTION`)."""


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
    rows, origin, grouped = _open(spec, split, split_spec, data_dir, source, hf_name)
    if not grouped:
        samples = [
            spec.convert(row, ref, default_id, **options) for ref, row, default_id in islice(rows, limit)
        ]
        report = LoadReport(spec.name, split, origin, len(samples), len(samples))
        logger.info("loaded %d %s/%s samples from %s", len(samples), spec.name, split, origin)
        return samples, report
    return _union(spec, split, rows, origin, limit, options)


def _union(
    spec: DatasetSpec, split: str, rows: _Rows, origin: str, limit: int | None, options: dict[str, Any]
) -> tuple[list[TaskSample], LoadReport]:
    """The rows of a file group as one split: a row whose question (stripped) an earlier row holds
    is left out and counted, so the earlier file's row wins (the group lists the richer file first).

    A stdlib loop rather than a dataframe library: the rows are converted one by one anyway, and
    ``limit`` stops the read early.
    """
    samples: list[TaskSample] = []
    seen: set[str] = set()
    read = duplicates = 0
    for ref, row, default_id in rows:
        if limit is not None and len(samples) >= limit:
            break
        sample = spec.convert(row, ref, default_id, **options)
        read += 1
        key = sample.question.strip()
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        samples.append(sample)
    dropped = {DUPLICATE_QUESTION: duplicates}
    logger.info(
        "loaded %d %s/%s samples from %s (%d of %d rows read left out: their question is in an "
        "earlier file of the group)",
        len(samples), spec.name, split, origin, duplicates, read,
    )  # fmt: skip
    return samples, LoadReport(spec.name, split, origin, read, len(samples), dropped)


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
    rows, origin, _ = _open(spec, "auxiliary_train", split_spec, data_dir, source, hf_name)
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
) -> tuple[_Rows, str, bool]:
    """The rows of one split, where they come from and whether that is a group of files; raises
    the two-option error if nowhere."""
    override = _as_path(hf_name)
    if override is not None:
        paths = (override,) if override.is_file() else _first_file(override, split_spec.files)
        if paths is None:
            raise DataError(
                f"hf_name folder {str(override)!r} holds none of the {spec.name} "
                f"{split!r} files {[choice_name(c) for c in split_spec.files]}"
            )
        return _file_rows(spec, split, paths), _origin(paths), len(paths) > 1
    local_reason = "not tried (source='hf')"
    if source in ("auto", "local"):
        root = resolve_data_dir(data_dir)
        if root is None:
            local_reason = f"no data folder (neither data_dir nor {DATA_DIR_ENV} is set)"
        else:
            paths = _first_file(root / spec.name, split_spec.files)
            if paths is not None:
                return _file_rows(spec, split, paths), _origin(paths), len(paths) > 1
            names = " / ".join(choice_name(c) for c in split_spec.files)
            local_reason = f"no {names} in {str(root / spec.name)!r}"
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
    return _hub_rows(spec, split, hub, parts), f"hub {hub.describe()}", False


def _as_path(hf_name: str | None) -> Path | None:
    if hf_name is None:
        return None
    path = Path(hf_name).expanduser()
    if path.exists():
        return path
    if hf_name.endswith((".json", ".jsonl")) or hf_name.startswith(("/", "./", "../", "~")):
        raise DataError(f"hf_name {hf_name!r} looks like a path but does not exist")
    return None


def _first_file(folder: Path, choices: tuple[FileChoice, ...]) -> tuple[Path, ...] | None:
    """The files of the first candidate that exists (a group: all of its files exist)."""
    for choice in choices:
        paths = tuple(folder / n for n in ((choice,) if isinstance(choice, str) else choice))
        if all(p.is_file() for p in paths):
            return paths
    return None


def _origin(paths: tuple[Path, ...]) -> str:
    return " + ".join(str(p) for p in paths)


def _file_rows(spec: DatasetSpec, split: str, paths: tuple[Path, ...]) -> _Rows:
    """Every row of the files in order; default ids name the file when there are several."""
    for path in paths:
        prefix = f"{spec.name}-{split}-" + (f"{path.stem}-" if len(paths) > 1 else "")
        for ref, row in read_records(path):
            yield ref, row, f"{prefix}{ref.line}"


def _hub_rows(spec: DatasetSpec, split: str, hub: HubSource, parts: list[tuple[Any, Any]]) -> _Rows:
    number = 0
    for config, data in parts:
        for row_number, row in enumerate(data, 1):
            number += 1
            yield hub.ref(config, row_number), row, f"{spec.name}-{split}-{number}"


def _unavailable(
    spec: DatasetSpec, split_spec: SplitSpec, hub: HubSource | None, local_reason: str, hub_reason: str
) -> DataMissingError:
    local_fix = (
        f"set --data-dir / {DATA_DIR_ENV} to a folder with {spec.name}/{choice_name(split_spec.files[0])}"
    )
    if hub is None:
        fix = f"{local_fix}; {split_spec.missing or spec.no_hub or 'this split has no hub copy'}"
    else:
        fix = (
            f"{local_fix}, or install `optima[train]` and allow network access to load "
            f"{hub.describe()} from the Hugging Face hub"
        )
    return DataMissingError(
        f"cannot load {spec.name}: local data: {local_reason}; hub: {hub_reason}. To fix: {fix}"
    )
