"""The records the host loop and the trainer backends exchange (frozen dataclasses).

A run is a list of :class:`Stage` s that the backend declares. For each stage the host generates
(``generate="samples"``: N conversations per instance, scored per instance group and selected;
``"tree"``: the token normalizer, the MCTS turn trees, their preference pairs; ``"none"``: only the
stage's instances, for a backend that generates online), persists the
result, and hands it as a :class:`StageData` to ``backend.train`` (and to the
``optima_generation_end`` event); the backend returns a :class:`StageOutcome`.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from optima_env.types import Episode
from optima_trainers.run.checkpoint import TrainResult
from optima_trainers.run.records import PreferencePair

__all__ = ["Stage", "StageData", "StageOutcome", "stage_seed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """One stage of a run, as the backend plans it."""

    name: str
    """Folder name (``iter_00``, ``iter_01_dpo``, ...); unique within the run."""
    kind: str
    """What it trains, as a label of the metrics (``sft``, ``dpo``, or a backend's own)."""
    number: int
    """Position in the run (the ``iteration`` of the iteration hooks)."""
    generate: Literal["samples", "tree", "none"] = "samples"
    """What the host generates for it: sampled conversations, tree-search pairs, or nothing (an
    online backend such as ``grpo`` plays its own conversations on the stage's instances)."""
    init: bool = False
    """The initialization: format-diverse prompt pool, ``generation.init_temperature``."""
    start: Literal["previous", "base"] = "previous"
    """Which model the stage trains from: the previous stage's result, or the base model."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True, kw_only=True)
class StageData:
    """What the host generated for one stage (read back from the stage folder)."""

    stage: Stage
    """The stage."""
    folder: Path
    """The stage folder (the backend may write its own files there)."""
    episodes: tuple[Episode, ...] = ()
    """Every scored conversation, each with the reward that ranked it (samples: all N per
    instance; tree: every tree trajectory with its tree-search reward)."""
    selected: tuple[Episode, ...] = ()
    """Samples stages: the episodes the selection hook chose (iSFT: best per instance, top 70%, θ)."""
    pairs: tuple[PreferencePair, ...] = ()
    """Tree stages: the preference pairs kept (top fraction per tree)."""
    instances: tuple[int, ...] = ()
    """The training instances (split positions) the stage covers (``generate="none"`` stages)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """The generation's own metrics (``rollout/*``, ``select/*``, ``mcts/*``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageOutcome:
    """What a backend trained in one stage."""

    result: TrainResult | None
    """The checkpoint written (``None``: nothing to train on; the model carries over unchanged)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Extra metrics of the training (e.g. ``train/examples``), merged into the stage's record."""


def stage_seed(seed: int, stage: str) -> int:
    """The seed of one stage's jobs and sampling (31 bits).

    >>> stage_seed(0, "iter_00") == stage_seed(0, "iter_00") != stage_seed(0, "iter_01")
    True
    """
    return zlib.crc32(f"optima-stage/{seed}/{stage}".encode()) & 0x7FFFFFFF
