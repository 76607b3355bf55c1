"""Malformed files: every reader a user can feed (besides the dataset loaders, which
tests/optima_env/datasets/test_datasets.py covers) turns a truncated JSON line, a missing field, a wrong
type, an empty file and bytes that are not UTF-8 into one :class:`DataError` naming the file, the
line and the field.

Readers of append-only files (episodes, trees, metrics) skip a torn *last* line, which is what a
crash mid-append leaves; a truncated line anywhere else is an error. An empty append-only file
holds no records (a run killed before its first append); an empty JSON document is an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from optima_env import DataError, make
from optima_env.io import read_episodes
from optima_trainers.config.train import resolve_config
from optima_trainers.generation.tree_stage import finished_trees as _finished_trees
from optima_trainers.run.folder import RunDir, read_stage_result
from optima_trainers.run.records import PreferencePair, read_pairs

BAD_UTF8 = b'{"caf\xe9": 1}'


def _episode() -> dict[str, Any]:
    env = make("ie/synth-v0")
    env.reset(seed=0)
    while env.episode is None:
        env.step("<A>x</A>")
    return env.episode.to_dict()


def _pair() -> dict[str, Any]:
    return PreferencePair(
        prompt=({"role": "system", "content": "You are Alice."},),
        chosen="Alice: yes",
        rejected="Alice: no",
        chosen_value=1.0,
        rejected_value=0.5,
        task_id="ie/synth-v0",
        sample_id="s0",
        instance_index=0,
        depth=0,
        agent="Alice",
    ).to_dict()


def _without(record: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != name}


def _cut(record: dict[str, Any]) -> bytes:
    """The record's JSON line cut in half (what a crash mid-append leaves)."""
    line = json.dumps(record).encode()
    return line[: len(line) // 2]


def _jsonl(*records: dict[str, Any] | bytes) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records)


def _episodes_store(path: Path) -> Any:
    from benchmarks.evaluation.store import EpisodeStore

    return EpisodeStore(path)


# name -> (file name, reader, a good record, (missing field, wrong-type field and value),
#          what an empty file reads as: None = an error)
JSONL_READERS: dict[str, tuple[str, Callable[[Path], Any], Callable[[], dict], tuple, Any]] = {
    "episodes": ("episodes.jsonl", read_episodes, _episode, ("turns", ("num_tokens", "12")), []),
    "benchmark store": (
        "episodes.jsonl",
        _episodes_store,
        lambda: {**_episode(), "metadata": {"method": "cot", "instance": 0, "sample": 0}},
        ("gold", ("task_score", None)),
        "empty store",
    ),
    "pairs": ("pairs.jsonl", read_pairs, _pair, ("chosen", ("depth", 1.5)), []),
    "trees": (
        "trees.jsonl",
        _finished_trees,
        lambda: {"chunk": 0, "trees": [{}]},
        ("trees", ("chunk", "0")),
        {},
    ),
    "metrics": (
        "metrics.jsonl",
        lambda p: RunDir(p.parent).metrics(),
        lambda: {"stage": "iter_00", "reward/total": 0.5},
        ("stage", ("stage", 3)),
        [],
    ),
}


def _expect(reader: Callable[[Path], Any], path: Path, line: int | None, field: str | None) -> None:
    with pytest.raises(DataError) as info:
        reader(path)
    message = str(info.value)
    assert str(path) in message, message
    if line is not None:
        assert f"line {line}" in message, message
    if field is not None:
        assert re.search(rf"field '[\w.\[\]]*{re.escape(field)}'", message), message


@pytest.mark.parametrize("name", JSONL_READERS)
@pytest.mark.parametrize("damage", ["truncated", "missing", "wrong type", "empty", "not utf-8"])
def test_jsonl_readers(tmp_path: Path, name: str, damage: str) -> None:
    file_name, reader, good, (missing, (wrong, value)), empty = JSONL_READERS[name]
    path = tmp_path / file_name
    record = good()
    line, field = 2, None
    if damage == "truncated":  # a line cut short that is not the last one
        path.write_bytes(_jsonl(record, _cut(record), record))
    elif damage == "missing":
        path.write_bytes(_jsonl(record, _without(record, missing)))
        field = missing
    elif damage == "wrong type":
        path.write_bytes(_jsonl(record, {**record, wrong: value}))
        field = wrong
    elif damage == "not utf-8":
        path.write_bytes(_jsonl(record, BAD_UTF8))
    else:
        path.write_bytes(b"")
        result = reader(path)
        assert (len(result) == 0) if empty == "empty store" else result == empty
        return
    _expect(reader, path, line, field)


@pytest.mark.parametrize("name", ["episodes", "trees", "metrics"])
def test_append_only_files_skip_a_torn_last_line(tmp_path: Path, name: str) -> None:
    file_name, reader, good, _, _ = JSONL_READERS[name]
    path = tmp_path / file_name
    record = good()
    path.write_bytes(_jsonl(record) + _cut(record))  # a crash mid-append
    assert len(reader(path)) == 1


def _config() -> dict[str, Any]:
    return resolve_config("ie/synth-v0", "isft").to_dict()


# name -> (file name, reader, a good record, missing field, (wrong-type field, value))
JSON_READERS: dict[str, tuple[str, Callable[[Path], Any], Callable[[], dict], str, tuple]] = {
    "config.json": ("config.json", lambda p: RunDir.open(p.parent), _config, "task", ("iterations", "2")),
    "result.json": (
        "result.json",
        read_stage_result,
        lambda: {"model": "iter_00/checkpoint", "cursor_end": 3, "metrics": {}},
        "cursor_end",
        ("model", None),
    ),
    "state.json": (
        "state.json",
        lambda p: RunDir(p.parent).state(),
        lambda: {"stage": "x"},
        "",
        ("timings", []),
    ),
}


DAMAGES = ("truncated", "missing", "wrong type", "empty", "not utf-8")


@pytest.mark.parametrize(
    ("damage", "name"),
    [(d, n) for d in DAMAGES for n, reader in JSON_READERS.items() if d != "missing" or reader[3]],
)  # a file with no required field (state.json) has no "missing" case
def test_run_folder_json_readers(tmp_path: Path, name: str, damage: str) -> None:
    file_name, reader, good, missing, (wrong, value) = JSON_READERS[name]
    path = tmp_path / file_name
    text = json.dumps(good(), indent=2)
    line, field = None, None
    if damage == "truncated":
        path.write_text(text[: len(text) // 2], encoding="utf-8")
        line = text[: len(text) // 2].count("\n") + 1
    elif damage == "missing":
        path.write_text(json.dumps(_without(good(), missing)), encoding="utf-8")
        field = missing
    elif damage == "wrong type":
        path.write_text(json.dumps({**good(), wrong: value}), encoding="utf-8")
        field = wrong
    elif damage == "not utf-8":
        path.write_bytes(text.encode()[:10] + b"\xff\xfe" + text.encode()[10:])
        line = text[:10].count("\n") + 1
    else:
        path.write_bytes(b"")
    _expect(reader, path, line, field)
