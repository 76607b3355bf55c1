"""The run folder's on-disk format, and the one error a folder in an older format gets.

A run folder (:mod:`optima_trainers.run.folder`) is read in format :data:`RUN_FORMAT` only. Each
reader that meets a file in an older format raises :func:`old_format_error`: one line naming the
file, what marks it as older, its format, and what to do (finish that run with the release that
began it, or start a new run folder). Nothing is converted on the fly.

The formats (CHANGELOG.md tells when each changed)::

    1  config.json may hold a ``tree.reward`` section or ``generation.compute_type``; a line of
       trees.jsonl may hold several trees; a checkpoint's COMPLETE marker may lack the ``files``
       manifest or the training ``history``
    2  the tree reward derives from ``reward.*``, one tree per line of trees.jsonl, every COMPLETE
       marker holds its manifest and history
    3  today's: as 2, and every stage folder with episodes records the engine that generated them
       (``engine.json``, :func:`optima_trainers.generation.engines.check_stage_engine`)
"""

from __future__ import annotations

import os

from optima_env.errors import DataError

__all__ = ["RUN_FORMAT", "old_format_error"]

RUN_FORMAT = 3
"""The run folder format this optima_trainers writes and reads (the module docstring lists them)."""


def old_format_error(path: str | os.PathLike[str], found: str, *, version: int = 1) -> DataError:
    """The one-line error for ``path``, a file written in run folder format ``version``.

    >>> print(old_format_error("run/config.json", "field 'tree.reward'"))  # doctest: +ELLIPSIS
    run/config.json: field 'tree.reward': run folder format 1, this optima_trainers reads format 2 ...
    """
    return DataError(
        f"{path}: {found}: run folder format {version}, this optima_trainers reads format {RUN_FORMAT} "
        "only; finish that run with the optima_trainers release that began it, or start a new run folder"
    )
