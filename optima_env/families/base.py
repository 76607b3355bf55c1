"""``DatasetTask``: a task whose instances come from one of the benchmark datasets.

The instances of a split are read with :func:`optima_env.datasets.load_samples` on the first
:meth:`DatasetTask.samples` call and cached for the life of the task object, so building a task
(``optima_env.make_task``) costs nothing and a missing dataset is reported when it is first needed,
with the loader's message (what was tried, and how to provide the data).

Loads from local files are also shared between task objects of one process (a small LRU cache,
:data:`SHARED_CACHE_SIZE` entries) keyed by the arguments and by the name, size and modification
time of every file in the dataset's folder, so a changed file is read again. Samples are frozen
records, so sharing them is safe.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

from optima_env.datasets import list_datasets, load_samples, resolve_data_dir
from optima_env.datasets.sources import get_spec
from optima_env.errors import DataError, TaskContractError
from optima_env.task import Task, agent_names
from optima_env.types import TaskSample

__all__ = ["SHARED_CACHE_SIZE", "DatasetTask", "options_list"]

_SOURCES = ("auto", "local", "hf")
SHARED_CACHE_SIZE = 8
"""Loaded splits kept for reuse by other task objects of the same process."""
_SHARED: OrderedDict[Hashable, tuple[TaskSample, ...]] = OrderedDict()


class DatasetTask(Task):
    """Base of the paper's tasks: data loading shared by every family.

    Subclasses set :attr:`dataset` (an id of :func:`optima_env.datasets.list_datasets`).

    Args:
        num_agents: how many agents talk (Alice, Bob, Charlie, ...).
        data_dir: the benchmark data folder (holds ``<dataset>/<file>.jsonl``); default
            ``$OPTIMA_DATA_DIR``.
        source: ``auto`` (local files, else the Hugging Face hub), ``local`` or ``hf``.
        limit: keep only the first ``limit`` instances of each split.
        hf_name: another hub dataset name (``name`` or ``name:config``), or a path to a file or
            folder in the upstream format (e.g. the original 2WikiMultihopQA ``dev.json``).
        require_context: for the datasets with question-only copies (2WikiMultihopQA, TriviaQA):
            a row without its context raises (the default), or with ``False`` is played with an
            empty context (closed-book). The other datasets take no value.
    """

    dataset: ClassVar[str]

    def __init__(
        self,
        *,
        num_agents: int = 2,
        data_dir: str | os.PathLike[str] | None = None,
        source: str = "auto",
        limit: int | None = None,
        hf_name: str | None = None,
        require_context: bool | None = None,
    ) -> None:
        if getattr(type(self), "dataset", None) not in list_datasets():
            raise TaskContractError(
                f"{type(self).__name__}.dataset must be one of {list_datasets()}, "
                f"got {getattr(type(self), 'dataset', None)!r}"
            )
        if source not in _SOURCES:
            raise TaskContractError(f"source must be one of {list(_SOURCES)}, got {source!r}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise TaskContractError(f"limit must be a positive int or None, got {limit!r}")
        self.agents = agent_names(num_agents)
        self.data_dir = data_dir
        self.source = source
        self.limit = limit
        self.hf_name = hf_name
        if require_context is not None and not get_spec(self.dataset).context_option:
            takers = [d for d in list_datasets() if get_spec(d).context_option]
            raise TaskContractError(
                f"require_context applies to the datasets with question-only copies ({', '.join(takers)}); "
                f"{self.dataset} has none: drop it"
            )
        self.require_context = True if require_context is None else bool(require_context)
        self._cache: dict[str, tuple[TaskSample, ...]] = {}

    def load_options(self) -> dict[str, Any]:
        """Extra keyword arguments for :func:`~optima_env.datasets.load_samples` (per dataset)."""
        return {"require_context": self.require_context} if get_spec(self.dataset).context_option else {}

    def samples(self, split: str) -> Sequence[TaskSample]:
        """The instances of ``split``, loaded on first use and cached.

        Raises:
            DataError: the data is missing (the message names both ways to provide it) or a row is
                malformed (the message names file, line and field).
        """
        if split not in self._cache:
            options = self.load_options()
            key = self._shared_key(split, options)
            if key is not None and key in _SHARED:
                _SHARED.move_to_end(key)
                self._cache[split] = _SHARED[key]
                return self._cache[split]
            self._cache[split] = tuple(
                load_samples(
                    self.dataset,
                    split,
                    data_dir=self.data_dir,
                    source=self.source,  # type: ignore[arg-type]
                    limit=self.limit,
                    hf_name=self.hf_name,
                    **options,
                )
            )
            if key is not None:
                _SHARED[key] = self._cache[split]
                while len(_SHARED) > SHARED_CACHE_SIZE:
                    _SHARED.popitem(last=False)
        return self._cache[split]

    def _shared_key(self, split: str, options: dict[str, Any]) -> Hashable | None:
        """The shared-cache key of a local load, or ``None`` (hub, ``hf_name`` or no local folder)."""
        if self.source == "hf" or self.hf_name is not None:
            return None
        try:
            root = resolve_data_dir(self.data_dir)
        except DataError:  # the loader reports a bad folder with its own message
            return None
        if root is None or not (root / self.dataset).is_dir():
            return None
        folders = [root / self.dataset] + ([root / "arc_challenge"] if self.dataset == "mmlu" else [])
        files = []
        for folder in folders:
            for path in sorted(folder.iterdir()) if folder.is_dir() else ():
                stat = path.stat()
                files.append((str(path), stat.st_size, stat.st_mtime_ns))
        return (
            self.dataset,
            split,
            str(root.resolve()),
            self.source,
            self.limit,
            tuple(sorted(options.items())),
            tuple(files),
        )

    def question_text(self, sample: TaskSample) -> str:
        """The question as the agents read it (tasks add their suffix, e.g. the options)."""
        return sample.question

    def check_format_index(self, format_index: int | None) -> None:
        """Raise :class:`TaskContractError` unless ``format_index`` is ``None`` or in the pool."""
        if format_index is None:
            return
        if self.num_formats == 0:
            raise TaskContractError(f"{self.id} has no format pool; got format_index={format_index!r}")
        if isinstance(format_index, bool) or not isinstance(format_index, int):
            raise TaskContractError(f"format_index must be an int or None, got {format_index!r}")
        if not 0 <= format_index < self.num_formats:
            raise TaskContractError(
                f"format_index must be in [0, {self.num_formats}) for {self.id}, got {format_index!r}"
            )


def options_list(options: Sequence[str]) -> str:
    """Options as the reference code prints them into a question: a Python list literal.

    >>> options_list(["red", "it's blue"])
    '[\\'red\\', "it\\'s blue"]'
    """
    return repr(list(options))
