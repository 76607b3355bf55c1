"""Helpers of the benchmark tests: a task whose data is missing, and a PNG check."""

from __future__ import annotations

from collections.abc import Sequence

from optima_env import TaskSample, TaskSpec, hookimpl
from optima_env.errors import DataMissingError
from tests.helpers import TinyTask

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

MISSING_REASON = "no rows in /nowhere/tiny.jsonl; set OPTIMA_DATA_DIR to the benchmark data folder"


class NoDataTask(TinyTask):
    """A task whose data is not there: ``samples`` raises :class:`DataError`."""

    def samples(self, split: str) -> Sequence[TaskSample]:
        raise DataMissingError(MISSING_REASON)


class NoDataPlugin:
    @hookimpl
    def optima_register_tasks(self) -> list[TaskSpec]:
        return [TaskSpec(id="test/nodata-v0", factory=NoDataTask, family="information_exchange")]


def assert_png(path) -> None:
    """A non-empty, decodable PNG file."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 2000, path
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
