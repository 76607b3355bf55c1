"""The exception tree of optima.

Every error raised on purpose by the framework derives from :class:`OptimaError`, and also from the
builtin it refines, so that a generic ``except LookupError`` or ``except ValueError`` keeps working::

    OptimaError
    ├── UnknownTaskError        (LookupError)   a task id that is not registered
    ├── PluginError             (RuntimeError)  a plugin that breaks the contract (e.g. duplicate ids)
    ├── TaskContractError       (ValueError)    a task or env used against its contract
    │   └── EpisodeOverError                    a non-None action after the episode ended
    ├── EnvNotResetError        (RuntimeError)  an env used before its first ``reset()``
    ├── DataError               (ValueError)    a dataset file or row that is malformed or missing
    ├── ScoringError            (ValueError)    a scorer fed input it cannot score
    ├── BackendError            (RuntimeError)  a generation backend failed (after its retries)
    └── MissingDependencyError  (ImportError)   an optional extra is not installed

Messages say what was expected, what was got, and what to do.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "DataError",
    "EnvNotResetError",
    "EpisodeOverError",
    "MissingDependencyError",
    "OptimaError",
    "PluginError",
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


class EnvNotResetError(OptimaError, RuntimeError):
    """Raised when an environment is stepped or observed before its first ``reset()``."""


class DataError(OptimaError, ValueError):
    """Raised when a dataset file or one of its rows is missing or malformed."""


class ScoringError(OptimaError, ValueError):
    """Raised when a scorer gets input it cannot score (never silently scored 0)."""


class BackendError(OptimaError, RuntimeError):
    """Raised when a generation backend fails, after any retries it makes."""


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
