"""The exception tree of optima.

Every error raised on purpose by the framework derives from :class:`OptimaError`, and also from the
builtin it refines, so that a generic ``except LookupError`` or ``except ValueError`` keeps working::

    OptimaError
    ├── UnknownTaskError        (LookupError)   a task id that is not registered
    ├── PluginError             (RuntimeError)  a plugin that breaks the contract (e.g. duplicate ids)
    ├── TaskContractError       (ValueError)    a task or env used against its contract
    │   ├── EpisodeOverError                    a non-None action after the episode ended
    │   └── ConfigError                         a configuration key or value that is not valid
    ├── EnvNotResetError        (RuntimeError)  an env used before its first ``reset()``
    ├── DataError               (ValueError)    a dataset file or row that is malformed or missing
    │   ├── DataMissingError                    a dataset that is not there at all (no file, no hub)
    │   └── CorruptCheckpointError              checkpoint files that no longer match their manifest
    ├── EmptySelectionError     (ValueError)    training-data selection kept nothing: the run stops
    ├── ScoringError            (ValueError)    a scorer fed input it cannot score
    ├── BackendError            (RuntimeError)  a generation backend failed (after its retries)
    │   └── RolloutError                        the policy failed in ``rollout``; keeps finished episodes
    ├── RunConfigError          (ValueError)    a benchmark run that cannot start as configured
    └── MissingDependencyError  (ImportError)   an optional extra is not installed

Every exception class of ``optima_env``, ``optima_trainers`` and ``benchmarks`` is defined here
(the modules that raise them import them from here), and ``tests/test_structure.py`` checks that
each one derives from :class:`OptimaError` and is drawn above.

Messages say what was expected, what was got, and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "BackendError",
    "ConfigError",
    "CorruptCheckpointError",
    "DataError",
    "DataMissingError",
    "EmptySelectionError",
    "EnvNotResetError",
    "EpisodeOverError",
    "MissingDependencyError",
    "OptimaError",
    "PluginError",
    "RolloutError",
    "RunConfigError",
    "ScoringError",
    "TaskContractError",
    "UnknownTaskError",
]


class OptimaError(Exception):
    """Root of every error optima raises on purpose."""


class UnknownTaskError(OptimaError, LookupError):
    """Raised when a task id is not registered."""


class PluginError(OptimaError, RuntimeError):
    """Raised when a plugin breaks the plugin contract (duplicate ids, bad return values)."""


class TaskContractError(OptimaError, ValueError):
    """Raised when a task or environment is used against its contract."""


class EpisodeOverError(TaskContractError):
    """Raised when a finished agent is given an action other than ``None`` (PettingZoo's rule)."""


class ConfigError(TaskContractError):
    """Raised when a configuration value or key is not valid (names the key, the value and the fix)."""


class EnvNotResetError(OptimaError, RuntimeError):
    """Raised when an environment is stepped or observed before its first ``reset()``."""


class DataError(OptimaError, ValueError):
    """Raised when a dataset file or one of its rows is missing or malformed."""


class CorruptCheckpointError(DataError):
    """Raised when a checkpoint's files no longer match the manifest in its ``COMPLETE`` marker."""


class DataMissingError(DataError):
    """Raised when a dataset (or split) is not there at all: no local file and no hub copy. A
    benchmark run reports such a task as ``data missing`` and goes on; a malformed file is a plain
    :class:`DataError` (naming file, line and field) and stops the run."""


class EmptySelectionError(OptimaError, ValueError):
    """Raised when a stage's training-data selection keeps no trajectory (the run stops there
    instead of training on nothing); says how far the best one fell short and what to change."""


class ScoringError(OptimaError, ValueError):
    """Raised when a scorer gets input it cannot score (never silently scored 0)."""


class BackendError(OptimaError, RuntimeError):
    """Raised when a generation backend fails, after any retries it makes."""


class RolloutError(BackendError):
    """The policy failed during :func:`~optima_env.rollout.rollout`; the episodes finished before it
    are kept.

    Attributes:
        finished: ``{job position: Episode}`` of every episode that ended before the failure.
        pending: positions of the jobs that did not finish (in flight or not started), sorted.
        jobs: every :class:`~optima_env.rollout.RolloutJob` by position: the given ones, then those
            ``refill`` returned.

    (Typed ``Any`` here: this module is imported by every other one, so it names no record type.)
    """

    def __init__(
        self,
        message: str,
        *,
        finished: Mapping[int, Any],
        pending: Sequence[int],
        jobs: Sequence[Any] = (),
    ) -> None:
        super().__init__(message)
        self.finished: dict[int, Any] = dict(sorted(finished.items()))
        self.pending: list[int] = sorted(pending)
        self.jobs: list[Any] = list(jobs)

    @property
    def episodes(self) -> list[Any]:
        """The finished episodes, in job order."""
        return list(self.finished.values())


class RunConfigError(OptimaError, ValueError):
    """Raised when a benchmark run cannot start as configured (a conflicting resume, a missing suite
    module)."""


class MissingDependencyError(OptimaError, ImportError):
    """Raised when an optional dependency is needed but not installed; names the extra."""


def require(module: str, extra: str):
    """Import ``module`` or raise :class:`MissingDependencyError` naming the extra to install.

    >>> require("json", "train").__name__
    'json'
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"{module!r} is needed here but is not installed; install it with "
            f"`pip install 'optima[{extra}]'` (got: {exc})"
        ) from exc
