"""Data-parallel generation: under ``accelerate launch`` with N processes, every rank plays its
shard of a stage's jobs with its own engine, and the main process gathers the shards.

A stage's jobs (a sampled stage's episodes, a tree stage's normalizer conversations and trees)
are dealt to the N ranks in turn by job position (:meth:`Shard.split`: rank r plays positions
r, r + N, r + 2N, ...). A stage's jobs come instance by instance, each instance's samples side by
side, and instances differ in length (the EOS workload of ``--suite rollout``: contiguous halves
gave one rank twice the other's tokens); dealt in turn, every rank gets its share of every
instance. The split never changes a job's seed or request key (they depend on the job alone,
:func:`optima_env.rollout.job_seed`), so every episode equals a one-process run's.

Files, in the stage folder (``episodes.jsonl`` as the example)::

    episodes.jsonl             the stage's file: written by the main process only, in job order
                               once every rank is done (or appended by a one-process run)
    episodes.rank1of2.jsonl    rank 1's shard of a two-process run, appended as each episode
                               ends and resumed like any rollout (a killed rank loses nothing)
    episodes.rank1of2.done     rank 1 has every episode of its shard on disk (written atomically)

A phase computed at once from the gathered data (a sampled stage's scores, ``scored.jsonl``) is
sharded the same way (:func:`compute_shard`): each rank computes its positions' records and writes
them to its own file atomically (``scored.rank1of2.jsonl``, then its ``.done`` marker), and the
main process gathers them into the stage's file in key order. A rank killed while it computes
loses its shard's records, computed again on resume; none is ever half written.

A rank reads, besides its own shard file, only files nobody writes while it generates: the
stage's file and the shard files of another world size (an earlier attempt of the same stage
with a different number of processes); jobs found there are not played again (:func:`play_shard`).
The ranks synchronize through these files (:func:`collect` waits for the ``.done`` markers it
needs), not through ``torch.distributed``: a generation phase lasts hours, longer than a process
group's collective timeout, and a polling wait costs nothing while the others generate. The
launcher ends every process when one dies, so no one waits for a dead rank.

Why own code: accelerate's ``split_between_processes`` splits in memory, but the shards must
outlive a killed process and be resumed on disk, which no library here does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from optima_env.errors import DataError
from optima_env.io import append_jsonl, read_jsonl, write_text_atomic

__all__ = [
    "Shard",
    "collect",
    "compute_shard",
    "discard_shards",
    "own_file",
    "play_shard",
    "shard_files",
    "write_gathered",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
Key = Hashable
KeyOf = Callable[[dict[str, Any]], Key]


@dataclass(frozen=True, slots=True)
class Shard:
    """This process's part of a stage: rank ``rank`` of ``world`` processes."""

    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Shard:
        """This process's rank and world size (``RANK``, ``WORLD_SIZE``: set by ``accelerate
        launch`` and torchrun; one process without them)."""
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        if not 0 <= rank < world:
            raise DataError(
                f"RANK={rank} is not below WORLD_SIZE={world}; start the run with accelerate launch"
            )
        return cls(rank, world)

    @property
    def main(self) -> bool:
        """The main process (rank 0): the only one that writes the stage's own files."""
        return self.rank == 0

    def of(self, rank: int) -> Shard:
        """Rank ``rank`` of the same world."""
        return Shard(rank, self.world)

    def split(self, items: Sequence[T]) -> list[T]:
        """This rank's part of ``items``, dealt in turn: positions ``rank, rank + world, ...``
        (sizes differ by at most one; each rank gets its share of every run of similar jobs)."""
        return list(items[self.rank :: self.world])


def _stem_suffix(name: str) -> tuple[str, str]:
    stem, dot, suffix = name.partition(".")
    return stem, dot + suffix


def own_file(folder: Path, name: str, shard: Shard, *, marker: bool = False) -> Path:
    """The file rank ``shard.rank`` writes for ``name`` (``episodes.rank1of2.jsonl``; with
    ``marker``, its ``.done`` marker); the stage's file itself for one process."""
    if shard.world == 1 and not marker:
        return folder / name
    stem, suffix = _stem_suffix(name)
    return folder / f"{stem}.rank{shard.rank}of{shard.world}{'.done' if marker else suffix}"


def shard_files(folder: Path, name: str) -> list[tuple[Shard, Path]]:
    """Every shard file of ``name`` in ``folder`` (any world size), by world size then rank."""
    stem, suffix = _stem_suffix(name)
    pattern = re.compile(rf"{re.escape(stem)}\.rank(\d+)of(\d+){re.escape(suffix)}")
    found = []
    for path in folder.glob(f"{stem}.rank*of*{suffix}"):
        match = pattern.fullmatch(path.name)
        if match and int(match[1]) < int(match[2]):
            found.append((Shard(int(match[1]), int(match[2])), path))
    return sorted(found, key=lambda item: (item[0].world, item[0].rank))


def sources(folder: Path, name: str, shard: Shard | None = None) -> list[Path]:
    """The files holding finished records of ``name``: the stage's file first, then the shard
    files; with ``shard``, only those nobody writes while ``shard.world`` processes generate
    (shard files of another world size)."""
    files = [p for s, p in shard_files(folder, name) if shard is None or s.world != shard.world]
    return [folder / name, *files]


def job_key(record: dict[str, Any]) -> Key:
    """An episode record's job, ``(instance, sample)`` (``metadata["job"]``)."""
    job = record.get("metadata", {}).get("job")
    if not (isinstance(job, list) and len(job) == 2):
        raise DataError(
            f"episode {record.get('sample_id')!r} has no metadata['job']; the file was not written by "
            "optima_trainers: delete it to regenerate"
        )
    return int(job[0]), int(job[1])


def keyed(paths: Sequence[Path], key_of: KeyOf) -> dict[Key, tuple[Path, dict[str, Any]]]:
    """Every record of ``paths`` by key: ``(source, record)``; the first source holding a key wins
    (a later one holds the same work: a gather killed before it removed the shards), and a key
    twice in one file is an error. A torn last line (an interrupted append) is skipped."""
    found: dict[Key, tuple[Path, dict[str, Any]]] = {}
    for path in paths:
        seen: set[Key] = set()
        for record in read_records(path):
            key = key_of(record)
            if key in seen:
                raise DataError(f"{path}: {key} appears twice; the file is corrupt, delete it to regenerate")
            seen.add(key)
            found.setdefault(key, (path, record))
    return found


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file (none when it is missing; a torn last line skipped)."""
    if not path.is_file():
        return []

    def parse(record: Any) -> dict[str, Any]:
        if not isinstance(record, dict):
            raise DataError(f"expected a JSON object, got {type(record).__name__}")
        return record

    return read_jsonl(path, parse, fix="the file is corrupt: delete it to regenerate")


def play_shard(
    shard: Shard,
    folder: Path,
    name: str,
    keys: Sequence[Key],
    play: Callable[[list[int], Path, dict[Key, dict[str, Any]]], object],
    *,
    key_of: KeyOf = job_key,
    what: str = "jobs",
) -> None:
    """Play this rank's shard of ``keys`` (job positions ``shard.split``) into its own file, then
    mark it done. ``play(positions, path, reused)`` plays the positions whose records are not in
    ``reused`` (records of this shard finished in the files nobody writes now, by key), appending
    to ``path`` and resuming from what it holds. Nothing is played or marked when those files
    hold the whole shard (a gathered stage)."""
    positions = shard.split(range(len(keys)))
    prior = keyed(sources(folder, name, shard), key_of)
    reused = {keys[p]: prior[keys[p]][1] for p in positions if keys[p] in prior}
    path = own_file(folder, name, shard)
    logger.info(
        "rank %d/%d: generating %d of %d %s into %s (%d already gathered)",
        shard.rank, shard.world, len(positions), len(keys), what, path.name, len(reused),
    )  # fmt: skip
    if len(reused) == len(positions):
        return
    play(positions, path, reused)
    write_text_atomic(own_file(folder, name, shard, marker=True), json.dumps({what: len(positions)}) + "\n")


def compute_shard(
    shard: Shard,
    folder: Path,
    name: str,
    keys: Sequence[Key],
    compute: Callable[[list[int]], list[dict[str, Any]]],
    *,
    key_of: KeyOf = job_key,
    what: str = "records",
) -> list[dict[str, Any]] | None:
    """Compute this rank's records of ``keys`` (positions ``shard.split``) and write them at once,
    atomically, to its own file (then its marker); the main process gathers every rank's into the
    stage's file ``name`` and returns all of them in key order, the others return ``None``; one
    process writes ``name`` itself. ``compute(positions)`` returns the records of ``positions``
    (in order) that no finished file holds: the stage's file, this rank's own file of an earlier
    attempt, or another world size's shard files. The shard files stay (the caller removes them
    with the inputs they were computed from, :func:`discard_shards`)."""
    positions = shard.split(range(len(keys)))
    own = own_file(folder, name, shard)
    finished = keyed(sources(folder, name, shard), key_of)  # files nobody writes now
    prior = {**keyed([own], key_of), **finished} if shard.world > 1 else finished
    todo = [p for p in positions if keys[p] not in prior]
    logger.info(
        "rank %d/%d: computing %d of %d %s into %s (%d already done)",
        shard.rank, shard.world, len(positions), len(keys), what, own.name, len(positions) - len(todo),
    )  # fmt: skip
    made = dict(zip((keys[p] for p in todo), compute(todo) if todo else [], strict=True))
    mine = [made[keys[p]] if keys[p] in made else prior[keys[p]][1] for p in positions]
    if todo or (shard.world == 1 and not own.is_file()):
        write_gathered(folder, own.name, mine)
    if shard.world == 1:
        return mine
    if any(keys[p] not in finished for p in positions):  # the main process waits for this shard
        marker = own_file(folder, name, shard, marker=True)
        write_text_atomic(marker, json.dumps({what: len(positions)}) + "\n")
    if not shard.main:
        return None
    records = [record for _, record in collect(shard, folder, name, keys, key_of=key_of)]
    write_gathered(folder, name, records)
    return records


def collect(
    shard: Shard, folder: Path, name: str, keys: Sequence[Key], *, key_of: KeyOf = job_key
) -> list[tuple[Path, dict[str, Any]]]:
    """Every record of ``keys``, in their order, once each rank whose shard was not already
    gathered has marked it done, or the stage's file holds them all: ``(source, record)``. (The
    main process gathers a stage's file before it removes the markers; a rank that reads a
    phase's inputs while the main process is already past them finds them there.)"""
    prior = keyed(sources(folder, name, shard), key_of)
    waiting = []
    for rank in range(shard.world):
        mine = shard.of(rank).split(keys)
        if not all(k in prior for k in mine):
            waiting.append(own_file(folder, name, shard.of(rank), marker=True))
    if waiting:
        logger.info("rank %d/%d: waiting for %s", shard.rank, shard.world, ", ".join(p.name for p in waiting))
    _wait(waiting, folder / name, keys, key_of)
    found = keyed(sources(folder, name), key_of)
    missing = [k for k in keys if k not in found]
    if missing:
        raise DataError(
            f"{folder}: {name}: {len(missing)} of {len(keys)} records are in no file although every rank "
            f"marked its shard done (first: {missing[0]}); delete the stage's *.done files and --resume"
        )
    return [found[k] for k in keys]


def _wait(
    markers: Sequence[Path], stage: Path, keys: Sequence[Key], key_of: KeyOf, poll_s: float = 1.0
) -> None:
    """Until every marker exists or ``stage`` (replaced whole by the main process, never appended
    under several processes) holds every key; the file is read again only when it changed."""
    seen = None
    while not all(p.exists() for p in markers):
        try:
            stamp = stage.stat().st_mtime_ns
        except FileNotFoundError:
            stamp = None
        if stamp is not None and stamp != seen:
            seen = stamp
            found = keyed([stage], key_of)
            if all(k in found for k in keys):
                return
        time.sleep(poll_s)


def write_gathered(folder: Path, name: str, records: Sequence[dict[str, Any]]) -> None:
    """Write the stage's file ``name`` atomically from gathered records (main process), each line
    as :func:`~optima_env.io.append_jsonl` wrote it in the shard (the same bytes as one process)."""
    tmp = folder / f".{name}.gathered"
    tmp.unlink(missing_ok=True)
    tmp.touch()
    append_jsonl(tmp, records)
    os.replace(tmp, folder / name)


def fold(folder: Path, name: str, keys: Sequence[Key], *, key_of: KeyOf = job_key) -> None:
    """One process resuming a stage that several began: merge the shard files of ``name`` into the
    stage's file (in ``keys`` order) and remove them; nothing when there are none."""
    if not shard_files(folder, name):
        return
    found = keyed(sources(folder, name), key_of)
    write_gathered(folder, name, [found[k][1] for k in keys if k in found])
    discard_shards(folder, name)


def discard_shards(folder: Path, *names: str) -> None:
    """Remove the ``.done`` markers, then the shard files, of ``names`` (after the gather wrote
    the stage's files: a removal cut short leaves work the next gather reads again)."""
    for name in names:
        stem, _ = _stem_suffix(name)
        for marker in folder.glob(f"{stem}.rank*of*.done"):
            marker.unlink(missing_ok=True)
    for name in names:
        for _, path in shard_files(folder, name):
            path.unlink(missing_ok=True)
