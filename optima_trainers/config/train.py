"""The trainer configuration: one tree of frozen dataclasses, validated when it is built.

:class:`TrainConfig` holds the run (task, trainer, model, seed, iterations, ...) and its sections::

    generation  GenerationConfig   how conversations are sampled (optima_trainers.config.sections)
    reward      RewardConfig       the run's reward (optima_env.reward): sampled stages and, derived, trees
    selection   SelectionConfig    iSFT data selection (optima_trainers.sft.selection)
    sft         SFTTrainConfig     SFT stages (optima_trainers.sft.trainer)
    tree        TreeSearchConfig   tree search (optima_trainers.config.tree): normalizer, MCTS, pairs
                                   (its reward derives from ``reward``: ``TrainConfig.tree_reward``)
    dpo         DPOTrainConfig     DPO stages (optima_trainers.dpo.trainer)
    options     (a mapping)        a third-party backend's own options (its ``config_class``)

Every leaf has a dotted name (``reward.lambda_token``, ``dpo.beta``) for presets and for
``--set NAME=VALUE`` (:mod:`optima_env.configtree` parses and validates).

:func:`resolve_config` builds a run's configuration in layers, later ones winning:

1. the field defaults (the generic defaults: the reference recipes' common values);
2. the trainer backend's defaults (``TrainerSpec.defaults``, e.g. iDPO's ``dpo.rpo_alpha = 1.0``);
3. the recipe for this task and trainer (a :class:`~optima_env.specs.Recipe` with ``preset="code"``,
   registered through the ``optima_register_recipes`` hook by the task's plugin or the trainer's),
   then with ``preset="paper"`` the paper's differences (the ``preset="paper"`` recipe, spec §13
   items 5-6). Without a recipe the generic defaults stay (one notice is logged; a debate
   task also restarts SFT from the base model, spec §5 item 8). The task's own reward thresholds
   (``TaskSpec.reward``) apply to the run's reward;
4. the reward preset (:data:`REWARD_PRESETS`: ``code`` keeps the reference's special cases,
   ``paper`` is Eq. 1 alone), then with ``preset="paper"`` the paper's algorithm switches
   (:data:`FIDELITY_PRESETS`, spec §13 items 1, 2, 3, 7, 8 and 12; ``docs/fidelity.md`` lists
   every point, its two values and its test);
5. the compute profile (:data:`PROFILES`: ``paper`` keeps the spec's sizes with LoRA,
   ``paper-full`` the spec's sizes with full fine-tuning; ``cpu`` shrinks every size to minutes
   on 2 CPU cores, with LoRA), then the backend's extras for that profile;
6. explicit overrides (CLI flags and ``--set``); a reward weight set here reaches the tree reward
   too, dropping a recipe's ``tree.lambda_*`` (:attr:`TreeSearchConfig.lambda_token`).
7. the device's defaults for what is still unset: ``dtype="auto"`` (bf16 with a GPU, fp32 on CPUs)
   and gradient checkpointing (on with a GPU).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from optima_env.configtree import (
    ConfigError,
    apply,
    check_positive_int,
    from_dict,
    leaves,
    to_dict,
)
from optima_env.reward import RewardConfig
from optima_trainers.config.presets import FIDELITY_PRESETS, PROFILES, REWARD_PRESETS
from optima_trainers.config.sections import GenerationConfig
from optima_trainers.config.training import DPOTrainConfig, SelectionConfig, SFTTrainConfig
from optima_trainers.config.tree import TreeSearchConfig

__all__ = [
    "FIDELITY_PRESETS",
    "PROFILES",
    "REWARD_PRESETS",
    "GenerationConfig",
    "TrainConfig",
    "TreeSearchConfig",
    "resolve_config",
]

logger = logging.getLogger(__name__)

DEBATE = "debate"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    """Everything one training run needs (stored as ``config.json`` in the run folder)."""

    task: str
    """Resolved task id (``ie/synth-v0``)."""
    trainer: str
    """Name of a registered trainer backend (``isft``, ``idpo``, ``isft-dpo``, or a plugin's)."""
    model: str = "embedded"
    """Starting model: ``embedded``, a Hugging Face name or a local folder."""
    readability_model: str | None = None
    """Frozen model of the readability term (default: ``model``, the base model)."""
    readability_scorer: str = "transformers"
    """Registered readability scorer that computes the LM loss (``optima_register_readability_scorers``)."""
    seed: int = 0
    """Seed of everything (episodes, sampling, shuffling, training)."""
    preset: Literal["code", "paper"] = "code"
    """Which hyperparameter table was applied (the task's recipes or the paper's, spec §13)."""
    reward_preset: Literal["code", "paper"] = "code"
    """Reward special cases: the reference code's (``code``) or Eq. 1 alone (``paper``)."""
    profile: Literal["cpu", "paper", "paper-full"] = "cpu"
    """Which compute profile sized the run."""
    family: str = "information_exchange"
    """Task family (from its ``TaskSpec``)."""
    iterations: int = 2
    """Rounds of the trainer's own step, counted as the reference code counts them: an iSFT round
    is one SFT stage, the first being the initialization (so 1 trains the initialization alone); an
    iDPO round is one DPO stage, after the initialization; an iSFT-DPO round is one SFT+DPO cycle,
    the first SFT being the initialization. The run's first log line (and ``--print-config``)
    lists the stages, e.g. ``isft --iterations 3: 3 stages: iter_00 (init), iter_01 (sft), iter_02 (sft)``."""
    split: str = "train"
    """Split the training instances come from (taken in order, cursor wraps)."""
    task_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the task factory (e.g. ``{"hops": 3}``)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Weights and training precision. ``auto`` resolves when the configuration is built: ``bfloat16``
    with a CUDA GPU (training in bf16 mixed precision, TF32 matmuls allowed; generation and
    readability in bf16), ``float32`` on CPUs (this project's have no native bf16: a bf16 step takes
    minutes). ``--print-config`` shows the resolved value."""
    report_to: Literal["none", "tensorboard", "trackio", "wandb"] = "none"
    """Where TRL reports training metrics, and the host loop each stage's metrics (score, tokens
    per agent, reward terms, selection and training summaries): :mod:`optima_trainers.run.tracking`."""
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    """How conversations are sampled."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """The reward that ranks sampled conversations (iSFT stages)."""
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    """iSFT data selection."""
    sft: SFTTrainConfig = field(default_factory=SFTTrainConfig)
    """SFT stages."""
    tree: TreeSearchConfig = field(default_factory=TreeSearchConfig)
    """Tree-search stages (iDPO, iSFT-DPO)."""
    dpo: DPOTrainConfig = field(default_factory=DPOTrainConfig)
    """DPO stages."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """A third-party backend's own options (validated by its ``TrainerSpec.config_class``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.trainer, str) or not self.trainer:
            raise ConfigError(f"trainer must be a registered trainer name, got {self.trainer!r}")
        check_positive_int("iterations", self.iterations)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an int, got {self.seed!r}")

    @property
    def tree_reward(self) -> RewardConfig:
        """The reward of tree trajectories (:meth:`TreeSearchConfig.reward_of` the run's reward)."""
        return self.tree.reward_of(self.reward)

    @property
    def is_debate(self) -> bool:
        """True for solver/critic debate tasks."""
        return self.family == DEBATE

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready nested dict."""
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Rebuild from :meth:`to_dict` output; unknown keys raise :class:`ConfigError`."""
        return from_dict(cls, data)

    def replace(self, **overrides: Any) -> TrainConfig:
        """A copy with dotted overrides applied (``replace(**{"reward.lambda_token": 0.4})``)."""
        return apply(self, overrides)

    def resume_conflicts(self, other: TrainConfig) -> dict[str, tuple[Any, Any]]:
        """The settings in which ``other`` departs from this stored run's, as ``{dotted name:
        (stored, other)}``; ``iterations`` is not one (a resumed run may run longer)."""
        mine, theirs = _flat(self.to_dict()), _flat(other.to_dict())
        return {
            k: (mine.get(k), theirs.get(k))
            for k in sorted(mine.keys() | theirs.keys())
            if k != "iterations" and mine.get(k) != theirs.get(k)
        }


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict as ``{dotted key: leaf}`` (an empty section is a leaf)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


_RUN_FIELDS = ("task", "trainer", "preset", "profile", "family")

def _user_reward_reaches_trees(layers: list[Mapping[str, Any]], user: Mapping[str, Any]) -> dict[str, Any]:
    """``tree.lambda_*: None`` for each weight the user set in ``reward`` but not in ``tree``,
    when an earlier layer (a recipe) gave the tree its own value: the user's weight then reaches
    the tree reward too (see :attr:`TreeSearchConfig.lambda_token`)."""
    cleared = {}
    for name in ("lambda_token", "lambda_loss"):
        tree_key = f"tree.{name}"
        if f"reward.{name}" in user and tree_key not in user and any(tree_key in layer for layer in layers):
            logger.info("reward.%s you set also applies to the tree search (the recipe's %s is dropped)",
                        name, tree_key)
            cleared[tree_key] = None
    return cleared


def _task_reward(reward: Mapping[str, Any]) -> dict[str, Any]:
    return {f"reward.{k}": v for k, v in reward.items()}


def _task_presets(task: Any, trainer: str, preset: str, family: str, pm: Any = None) -> dict[str, Any]:
    """Layer 3: the ``code`` recipe registered for (task, trainer), then under ``preset="paper"``
    the ``paper`` one on top (:func:`optima_env.registry.recipe_specs` of ``pm``, or of a fresh
    plugin manager)."""
    from optima_env.registry import get_plugin_manager, recipe_specs

    recipes = recipe_specs(pm if pm is not None else get_plugin_manager())
    task_id = getattr(task, "id", task)
    found = {p: dict(r.values) for (t, n, p), r in recipes.items() if (t, n) == (task_id, trainer)}
    code = found.get("code", {})
    if not code:
        elsewhere = sorted({t for t, n, _ in recipes if n == trainer})  # a misspelt task id shows here
        logger.warning(
            "task %r has no %r preset for trainer %r: training with the generic defaults "
            "(optima_trainers.config.train; a plugin gives it one by registering a Recipe through "
            "optima_register_recipes)%s",
            task_id,
            "code",
            trainer,
            f"; {trainer!r} has recipes for {', '.join(elsewhere)}" if elsewhere else "",
        )
        if family == DEBATE:
            code["sft.restart_from_base"] = True  # spec §5 item 8: debate SFT restarts from the base
    if preset == "paper":
        code.update(found.get("paper", {}))
    return code


def resolve_config(
    task: Any,
    trainer: Any,
    *,
    pm: Any = None,
    preset: Literal["code", "paper"] = "code",
    profile: Literal["cpu", "paper", "paper-full"] = "cpu",
    overrides: Mapping[str, Any] | None = None,
    device: Literal["cpu", "cuda"] | None = None,
    **run: Any,
) -> TrainConfig:
    """A full :class:`TrainConfig` (the layers of the module docstring), validated.

    Args:
        task: the task's :class:`~optima_env.specs.TaskSpec` (its id, family and reward
            thresholds are used), or a task id, looked up in ``pm``.
        trainer: the backend's :class:`~optima_env.specs.TrainerSpec`, or a trainer name.
        pm: the plugin manager whose tasks, trainers and recipes are used (``None``: a fresh one,
            :func:`optima_env.registry.get_plugin_manager`); pass the one plugins were added to.
        preset: ``code`` (the task's recipes, default) or ``paper`` (the paper's tables).
        profile: ``cpu`` (minutes on 2 cores, LoRA), ``paper`` (the spec's sizes, LoRA) or
            ``paper-full`` (the spec's sizes and full fine-tuning, as the reference).
        device: ``cuda`` or ``cpu``, for the device-dependent defaults (``dtype="auto"``,
            gradient checkpointing); ``None``: whether torch sees a CUDA GPU.
        overrides: dotted names to values (strings are parsed into the field's type).
        run: top-level fields (``model``, ``seed``, ``iterations``, ``task_kwargs``, ...), applied
            last like ``overrides``; ``None`` values are ignored.

    Raises:
        ConfigError: an unknown name, a value of the wrong type, or one out of range (a bad
            ``reward.lambda_token`` or ``selection.theta`` fails here, before any generation).
    """
    if isinstance(task, str) or isinstance(trainer, str):
        from optima_env.registry import get_plugin_manager, task_specs, trainer_specs

        pm = pm if pm is not None else get_plugin_manager()
        if isinstance(task, str):
            from optima_env.registry import resolve_task_id

            task = task_specs(pm)[resolve_task_id(task, pm)]
        if isinstance(trainer, str):
            specs = trainer_specs(pm)
            if trainer not in specs:
                raise ConfigError(f"no trainer {trainer!r}; registered: {', '.join(specs)}")
            trainer = specs[trainer]
    if preset not in ("code", "paper"):
        raise ConfigError(f"preset must be 'code' or 'paper', got {preset!r}")
    if profile not in PROFILES:
        raise ConfigError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
    unknown = set(run) & set(_RUN_FIELDS)
    if unknown:
        raise ConfigError(f"{sorted(unknown)} are set by resolve_config's own arguments; drop them")
    given = dict(overrides or {})
    reward_preset = run.get("reward_preset") or given.get("reward_preset") or "code"
    if reward_preset not in REWARD_PRESETS:
        raise ConfigError(f"reward_preset must be one of {sorted(REWARD_PRESETS)}, got {reward_preset!r}")
    layers: list[Mapping[str, Any]] = [
        dict(trainer.defaults),
        _task_presets(task, trainer.name, preset, task.family, pm),
        _task_reward(task.reward),
        REWARD_PRESETS[reward_preset],
        FIDELITY_PRESETS[preset],  # spec §13: the paper's algorithm switches under preset="paper"
        PROFILES[profile],
        dict(trainer.profiles.get(profile, {})),
    ]
    explicit = {k: v for k, v in run.items() if v is not None}
    layers += [given, explicit, _user_reward_reaches_trees(layers, {**given, **explicit})]
    config = TrainConfig(
        task=task.id, trainer=trainer.name, preset=preset, profile=profile, family=task.family
    )
    options: dict[str, Any] = {}
    for layer in layers:
        plain = {k: v for k, v in layer.items() if not k.startswith("options.")}
        options.update({k[len("options.") :]: v for k, v in layer.items() if k.startswith("options.")})
        config = apply(config, plain)
    return check_options(_on_device(config, device), trainer, options)


def _on_device(config: TrainConfig, device: str | None) -> TrainConfig:
    """The device-dependent defaults still unset after every layer: ``dtype="auto"`` and
    ``sft``/``dpo.gradient_checkpointing=None`` (bf16 and checkpointing with a GPU; fp32 and none
    on CPUs). ``device=None`` asks torch (when installed) whether CUDA is there."""
    if device is None:
        device = "cuda" if cuda_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device must be 'cpu' or 'cuda', got {device!r}")
    cuda = device == "cuda"
    resolved: dict[str, Any] = {}
    if config.dtype == "auto":
        resolved["dtype"] = "bfloat16" if cuda else "float32"
    for section in ("sft", "dpo"):
        if getattr(config, section).gradient_checkpointing is None:
            resolved[f"{section}.gradient_checkpointing"] = cuda
    return apply(config, resolved) if resolved else config


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA GPU (torch is imported only when installed)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def check_options(config: TrainConfig, trainer: Any, extra: Mapping[str, Any] | None = None) -> TrainConfig:
    """Validate ``config.options`` (plus ``extra``, dotted names within the options) with the
    backend's ``config_class``, filling its defaults; strings are parsed into the fields' types."""
    cls = getattr(trainer, "config_class", None)
    merged = {**dict(config.options), **dict(extra or {})}
    if cls is None:
        if merged:
            raise ConfigError(
                f"trainer {trainer.name!r} takes no options, got options {sorted(merged)}; "
                "drop the options.* settings"
            )
        return config
    nested: dict[str, Any] = {}
    for dotted, value in merged.items():
        *parents, leaf = dotted.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    options = to_dict(from_dict(cls, nested, prefix="options.", strict=False))
    return config if options == dict(config.options) else apply(config, {"options": options})


def option_names(trainer: Any) -> list[str]:
    """The dotted ``options.*`` names of a backend's own options."""
    cls = getattr(trainer, "config_class", None)
    return [] if cls is None else list(leaves(cls, "options."))
