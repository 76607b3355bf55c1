"""The defaults of one benchmark suite: :class:`Suite` (the suites themselves are declared in
:mod:`benchmarks.suites`, the demo's in :mod:`benchmarks.demo.tasks`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Suite"]


@dataclass(frozen=True, kw_only=True)
class Suite:
    """Defaults of one suite (every field can be overridden from the command line)."""

    name: str
    description: str
    tasks: tuple[tuple[str, ...], ...] = (("ie/synth-v1",),)
    """Tasks in table order, each a tuple of alternative names
    (see :data:`benchmarks.suites.PAPER_TASKS`)."""
    methods: tuple[str, ...] = ("cot", "mad")
    instances: int | None = 4
    """Instances per task (the first N of the split); ``None`` = the whole split."""
    ie_instances: int | None = None
    """When set, information-exchange tasks use this many instances instead (paper: 1000)."""
    max_turns: int = 6
    max_new_tokens: int = 96
    sc_n: int = 8
    scaling_k: int = 8
    scaling: bool = False
    """Play every method ``scaling_k`` times per instance and report the scaling curves."""
    backend: str = "hf"
    concurrency: int = 16
    """Episodes in flight (the engine's batch size per turn); ``--concurrency`` overrides it."""
    task_kwargs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Task factory keyword arguments per task id (e.g. the demo's synthetic setting)."""
    stop_at_speaker_tags: bool = False
    """Cut a turn where it starts writing an agent's ``"Name:"`` tag (as the demo evaluates)."""
    controls: bool = False
    """Play the controls (:mod:`benchmarks.evaluation.controls`) as ``--controls`` does."""
    adapters: tuple[tuple[str, str], ...] = ()
    """Trained systems played as extra rows when no ``--checkpoint`` is given: ``(label, folder)``
    pairs (absolute folders, under :data:`benchmarks.suites.DEMO_ADAPTERS`); a missing folder is skipped with a
    notice."""

    def num_instances(self, *, family: str, available: int, override: int | None = None) -> int:
        """How many instances of a task to evaluate (``override`` is ``--episodes``)."""
        if override is not None:
            wanted: int | None = override
        elif family == "information_exchange" and self.ie_instances is not None:
            wanted = self.ie_instances
        else:
            wanted = self.instances
        return available if wanted is None else min(wanted, available)
