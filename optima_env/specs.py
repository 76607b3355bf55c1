"""What plugins register: tasks, trainer backends and readability scorers (frozen records).

The ``optima_register_*`` hooks (:mod:`optima_env.hookspecs`) return lists of these;
:mod:`optima_env.registry` collects and indexes them. This module imports neither, so the hook
specifications and the registry depend on it and not on each other.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from optima_env.errors import PluginError

if TYPE_CHECKING:
    from optima_env.task import Task

__all__ = ["TASK_ID_PATTERN", "TRAINER_NAME_PATTERN", "ReadabilitySpec", "TaskSpec", "TrainerSpec"]

TASK_ID_PATTERN = re.compile(r"^(?:(?P<ns>[\w.-]+)/)?(?P<name>[\w.]+(?:-[a-z][\w.]*)*?)(?:-v(?P<v>\d+))?$")
TRAINER_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]*$")

Overrides = Mapping[str, Any]
"""Dotted configuration names to values, e.g. ``{"reward.lambda_token": 0.6, "iterations": 6}``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSpec:
    """A registered task: an id (``namespace/name-vN``), a factory building the task, and what the
    trainers and the reward need to know about it."""

    id: str
    """``namespace/name-vN``."""
    factory: Callable[..., Task]
    """Builds the task from keyword arguments (``kwargs`` below, then those given to ``make``)."""
    family: str
    """``information_exchange`` or ``debate`` (free text for third-party families)."""
    description: str = ""
    """One line shown by listings."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Default keyword arguments for ``factory`` (overridden by those given to ``make``)."""
    presets: Mapping[str, Mapping[str, Overrides]] = field(default_factory=dict)
    """Trainer hyperparameters of this task: ``{"code": {trainer: overrides}, "paper": {trainer:
    overrides}}``. ``code`` holds the task's recipe per trainer name (``isft``, ``idpo``, ...);
    ``paper`` holds only what the paper's tables change on top of it. Overrides use the dotted
    names of :class:`optima_trainers.config.TrainConfig` (``selection.theta``, ``dpo.beta``, ...).
    A task without presets trains with the documented generic defaults (a notice is logged)."""
    reward: Overrides = field(default_factory=dict)
    """This task's reward thresholds, as :class:`~optima_env.reward.RewardConfig` field names:
    e.g. ``{"short_trajectory_tokens": 8}`` for a task whose right answers are a few tokens long,
    or ``{"repeated_turn_zero_loss": False}`` where agreeing by repeating a bare tag is normal.
    Applied by the trainers and the benchmarks on top of the reward preset's values."""

    def __post_init__(self) -> None:
        if not TASK_ID_PATTERN.match(self.id):
            raise PluginError(
                f"task id {self.id!r} is not of the form 'namespace/name-vN' "
                "(letters, digits, '_', '.', '-'); rename the task"
            )
        if not isinstance(self.presets, Mapping) or not set(self.presets) <= {"code", "paper"}:
            raise PluginError(
                f"task {self.id!r}: presets must be a mapping with keys 'code' and/or 'paper', got "
                f"{sorted(self.presets) if isinstance(self.presets, Mapping) else self.presets!r}"
            )
        for name, per_trainer in self.presets.items():
            if not isinstance(per_trainer, Mapping) or not all(
                isinstance(v, Mapping) for v in per_trainer.values()
            ):
                raise PluginError(
                    f"task {self.id!r}: presets[{name!r}] must map trainer names to mappings of "
                    "dotted config names to values"
                )
        if not isinstance(self.reward, Mapping):
            raise PluginError(f"task {self.id!r}: reward must be a mapping of RewardConfig fields")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerSpec:
    """A registered trainer backend (``isft``, ``idpo``, ``isft-dpo`` for the built-ins).

    The host loop (:class:`optima_trainers.loop.IterativeTrainer`) builds the backend with
    ``factory(config)`` and calls it: ``backend.stages(config)`` (what to generate) and, for each
    stage, ``backend.train(data, context)`` (train and return what it trained); the contract is
    :class:`optima_trainers.backends.TrainerBackend`.
    """

    name: str
    """What ``--trainer`` takes: lower case, digits, ``-`` and ``_``."""
    factory: Callable[..., Any]
    """``factory(config) -> backend``: an :class:`optima_trainers.backends.TrainerBackend`."""
    description: str = ""
    """One line shown by ``--help``."""
    config_class: type | None = None
    """The dataclass of the backend's own options (``TrainConfig.options``, set on the command line
    with ``--set options.FIELD=VALUE``); ``None`` when it has none beyond the shared sections."""
    defaults: Overrides = field(default_factory=dict)
    """Dotted :class:`~optima_trainers.config.TrainConfig` values this backend needs (applied over
    the field defaults, before the task's presets), e.g. ``{"dpo.rpo_alpha": 1.0}``."""
    profiles: Mapping[str, Overrides] = field(default_factory=dict)
    """Extra values per compute profile (``cpu``, ``paper``), applied after the profile's own."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not TRAINER_NAME_PATTERN.match(self.name):
            raise PluginError(
                f"trainer name {self.name!r} must be lower case letters, digits, '-' or '_', "
                "starting with a letter; rename the trainer"
            )
        if self.config_class is not None and not (
            isinstance(self.config_class, type) and hasattr(self.config_class, "__dataclass_fields__")
        ):
            raise PluginError(
                f"trainer {self.name!r}: config_class must be a dataclass type or None, "
                f"got {self.config_class!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadabilitySpec:
    """A registered readability scorer: ``factory(model, **kwargs)`` returns a callable mapping
    turn texts to per-turn LM losses of a frozen base model (spec §3)."""

    name: str
    """What ``readability_scorer`` (trainer config) takes, e.g. ``transformers``."""
    factory: Callable[..., Any]
    """``factory(model: str, *, dtype: str = "float32", **kwargs) -> scorer``."""
    description: str = ""
    """One line shown by listings."""
