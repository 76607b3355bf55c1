"""The run's episode file: append-only JSONL, written as each episode ends, read back to resume.

Every episode carries its unit key in ``metadata``: ``method`` (the method key), ``instance`` (the
index in the split) and ``sample`` (the sample number), with ``Episode.task_id``. On open the file
is read with :func:`optima_env.io.read_episodes` (a torn last line from a crash is skipped),
duplicates of a key are dropped (the first wins) and, when anything was dropped, the file is
rewritten atomically so later appends never follow a torn line.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from optima_env.errors import DataError
from optima_env.io import append_jsonl, read_episodes, read_text, write_episodes
from optima_env.types import Episode

__all__ = ["EpisodeStore", "UnitKey", "unit_key"]

logger = logging.getLogger(__name__)

UnitKey = tuple[str, str, int, int]
"""(method key, task id, instance index, sample number)."""


def unit_key(episode: Episode) -> UnitKey:
    """The unit key stored in an episode's metadata; :class:`DataError` when it has none."""
    meta = episode.metadata
    try:
        return (str(meta["method"]), episode.task_id, int(meta["instance"]), int(meta["sample"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(
            f"episode {episode.sample_id!r} of {episode.task_id!r} has no benchmark unit key "
            f"(metadata 'method', 'instance', 'sample'; got {sorted(meta)}); the file was not written "
            "by benchmarks.run: pass another --out"
        ) from exc


class EpisodeStore:
    """The episodes of one run folder, indexed by unit key."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._episodes: dict[UnitKey, Episode] = {}
        if not self.path.exists():
            return
        lines = sum(1 for line in read_text(self.path).split("\n") if line.strip())
        episodes = read_episodes(self.path)
        for episode in episodes:
            self._episodes.setdefault(unit_key(episode), episode)
        if len(self._episodes) != lines:
            logger.warning(
                "%s: kept %d of %d lines (torn or duplicate lines dropped); rewriting it",
                self.path,
                len(self._episodes),
                lines,
            )
            write_episodes(self.path, self._episodes.values())

    def __len__(self) -> int:
        return len(self._episodes)

    def __contains__(self, key: object) -> bool:
        return key in self._episodes

    def add(self, episode: Episode) -> None:
        """Append one episode (flushed and fsync'ed) unless its unit is already stored."""
        key = unit_key(episode)
        if key in self._episodes:
            return
        append_jsonl(self.path, [episode.to_dict()])
        self._episodes[key] = episode

    def get(self, key: UnitKey) -> Episode | None:
        return self._episodes.get(key)

    def items(self) -> Iterable[tuple[UnitKey, Episode]]:
        """Every ``(unit key, episode)`` held."""
        return self._episodes.items()

    def select(
        self, method: str, task_id: str, instances: Iterable[int], samples: int
    ) -> list[list[Episode]]:
        """Per instance, its samples in order; raises :class:`DataError` if one is missing."""
        out = []
        for index in instances:
            group = []
            for k in range(samples):
                episode = self._episodes.get((method, task_id, index, k))
                if episode is None:
                    raise DataError(
                        f"{self.path}: no episode for method {method!r}, task {task_id!r}, instance "
                        f"{index}, sample {k}; the run did not finish it: rerun the same command"
                    )
                group.append(episode)
            out.append(group)
        return out
