"""What plugins register: tasks, trainer backends, recipes and readability scorers (frozen records).

The ``optima_register_*`` hooks (:mod:`optima_env.hookspecs`) return lists of these;
:mod:`optima_env.registry` collects and indexes them. This module imports neither, so the hook
specifications and the registry depend on it and not on each other.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from optima_env.errors import PluginError

if TYPE_CHECKING:
    from optima_env.task import Task

__all__ = [
    "RECIPE_PRESETS",
    "TASK_ID_PATTERN",
    "TRAINER_NAME_PATTERN",
    "ReadabilitySpec",
    "Recipe",
    "TaskSpec",
    "TrainerSpec",
]

TASK_ID_PATTERN = re.compile(r"^(?:(?P<ns>[\w.-]+)/)?(?P<name>[\w.]+(?:-[a-z][\w.]*)*?)(?:-v(?P<v>\d+))?$")
TRAINER_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]*$")

Overrides = Mapping[str, Any]
"""Dotted configuration names to values, e.g. ``{"reward.lambda_token": 0.6, "iterations": 6}``."""

RECIPE_PRESETS = ("code", "paper")
"""What ``--preset`` takes: ``code`` (the reference code's recipes) and ``paper`` (the paper's tables)."""


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
    reward: Overrides = field(default_factory=dict)
    """This task's reward thresholds, as :class:`~optima_env.reward.RewardConfig` field names:
    e.g. ``{"short_trajectory_tokens": 8}`` for a task whose right answers are a few tokens long,
    or ``{"repeated_turn_zero_loss": False}`` where agreeing by repeating a bare tag is normal.
    Applied by the trainers and the benchmarks on top of the reward preset's values."""
    presets: InitVar[Any] = None
    """Removed: trainer hyperparameters are :class:`Recipe` records (``optima_register_recipes``),
    not part of the task. Given, it raises a :class:`PluginError` saying so."""

    def __post_init__(self, presets: Any) -> None:
        if not TASK_ID_PATTERN.match(self.id):
            raise PluginError(
                f"task id {self.id!r} is not of the form 'namespace/name-vN' "
                "(letters, digits, '_', '.', '-'); rename the task"
            )
        if presets is not None:
            raise PluginError(
                f"task {self.id!r}: TaskSpec.presets was removed; register the trainers' "
                "hyperparameters as Recipe records through the optima_register_recipes hook "
                "(Recipe.table(task_id, presets) converts the old mapping; README, 'Recipes')"
            )
        if not isinstance(self.reward, Mapping):
            raise PluginError(f"task {self.id!r}: reward must be a mapping of RewardConfig fields")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerSpec:
    """A registered trainer backend (``isft``, ``idpo``, ``isft-dpo`` for the built-ins).

    The host loop (:class:`optima_trainers.host.loop.IterativeTrainer`) builds the backend with
    ``factory(config)`` and calls it: ``backend.stages(config)`` (what to generate) and, for each
    stage, ``backend.train(data, context)`` (train and return what it trained); the contract is
    :class:`optima_trainers.backends.contract.TrainerBackend`.
    """

    name: str
    """What ``--trainer`` takes: lower case, digits, ``-`` and ``_``."""
    factory: Callable[..., Any]
    """``factory(config) -> backend``: an :class:`optima_trainers.backends.contract.TrainerBackend`."""
    description: str = ""
    """One line shown by ``--help``."""
    config_class: type | None = None
    """The dataclass of the backend's own options (``TrainConfig.options``, set on the command line
    with ``--set options.FIELD=VALUE``); ``None`` when it has none beyond the shared sections."""
    defaults: Overrides = field(default_factory=dict)
    """Dotted :class:`~optima_trainers.config.train.TrainConfig` values this backend needs (applied over
    the field defaults, before the task's recipe), e.g. ``{"dpo.rpo_alpha": 1.0}``."""
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
class Recipe:
    """A trainer's hyperparameters for one task: what ``resolve_config`` applies for ``task`` and
    ``trainer`` over the backend's defaults (layer 3 of :mod:`optima_trainers.config.train`).

    Registered through the ``optima_register_recipes`` hook by whoever knows the values: a task
    plugin for the trainers it was tuned with (the built-in tasks carry the paper's recipes for
    ``isft``, ``idpo`` and ``isft-dpo``), or a trainer plugin for the tasks it knows. Neither
    :class:`TaskSpec` nor :class:`TrainerSpec` names the other. A recipe for a task or trainer
    that is not installed is never applied; one ``(task, trainer, preset)`` registered twice is a
    :class:`PluginError` naming both plugins.
    """

    task: str
    """The task id it applies to, exactly (``ie/synth-v0``)."""
    trainer: str
    """The trainer name it applies to (``isft``, ``rft``, ...)."""
    values: Overrides
    """Dotted :class:`optima_trainers.config.train.TrainConfig` names to values (``selection.theta``,
    ``dpo.beta``, ``options.per_instance``, ...); checked when a configuration is resolved."""
    preset: Literal["code", "paper"] = "code"
    """``code``: the recipe (used under both presets); ``paper``: only what the paper's tables
    change on top of it (applied after it under ``--preset paper``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not TASK_ID_PATTERN.match(self.task):
            raise PluginError(f"recipe task {self.task!r} is not a task id ('namespace/name-vN')")
        if not isinstance(self.trainer, str) or not TRAINER_NAME_PATTERN.match(self.trainer):
            raise PluginError(f"recipe for {self.task!r}: trainer {self.trainer!r} is not a trainer name")
        if self.preset not in RECIPE_PRESETS:
            raise PluginError(
                f"recipe for {self.task!r} / {self.trainer!r}: preset must be one of "
                f"{', '.join(map(repr, RECIPE_PRESETS))}, got {self.preset!r}"
            )
        if not isinstance(self.values, Mapping) or not all(isinstance(k, str) for k in self.values):
            raise PluginError(
                f"recipe for {self.task!r} / {self.trainer!r}: values must map dotted config "
                f"names to values, got {self.values!r}"
            )
        object.__setattr__(self, "values", dict(self.values))  # a copy: the plugin's table may change

    @property
    def key(self) -> tuple[str, str, str]:
        """``(task, trainer, preset)``: what at most one plugin registers."""
        return (self.task, self.trainer, self.preset)

    def __str__(self) -> str:
        return f"recipe ({self.task}, {self.trainer}, {self.preset})"

    @classmethod
    def table(cls, task: str, table: Mapping[str, Mapping[str, Overrides]]) -> list[Recipe]:
        """The recipes of a ``{preset: {trainer: values}}`` table for one task, e.g.
        ``Recipe.table("ie/synth-v0", {"code": {"isft": {"selection.theta": 0.4}}})``."""
        if not isinstance(table, Mapping) or not all(isinstance(v, Mapping) for v in table.values()):
            raise PluginError(
                f"recipes for {task!r}: expected {{preset: {{trainer: {{dotted name: value}}}}}}, "
                f"got {table!r}"
            )
        return [
            cls(task=task, trainer=trainer, preset=preset, values=values)
            for preset, per_trainer in table.items()
            for trainer, values in per_trainer.items()
        ]


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
