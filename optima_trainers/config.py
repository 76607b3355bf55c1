"""The trainer configuration: one tree of frozen dataclasses, validated when it is built.

:class:`TrainConfig` holds the run (task, trainer, model, seed, iterations, ...) and its sections::

    generation  GenerationConfig   how conversations are sampled (sizes, caps, temperatures, backend)
    reward      RewardConfig       the run's reward (optima_env.reward): sampled stages and, derived, trees
    selection   SelectionConfig    iSFT data selection (optima_trainers.selection)
    sft         SFTTrainConfig     SFT stages (optima_trainers.sft)
    tree        TreeSearchConfig   tree-search stages: normalizer, MCTS, pair rules (its reward derives
                                   from ``reward``: :meth:`TreeSearchConfig.reward_of`)
    dpo         DPOTrainConfig     DPO stages (optima_trainers.dpo)
    options     (a mapping)        a third-party backend's own options (its ``config_class``)

Every leaf has a dotted name (``reward.lambda_token``, ``dpo.beta``) for presets and for
``--set NAME=VALUE`` (:mod:`optima_env.configtree` parses and validates).

:func:`resolve_config` builds a run's configuration in layers, later ones winning:

1. the field defaults (the generic defaults: the reference recipes' common values);
2. the trainer backend's defaults (``TrainerSpec.defaults``, e.g. iDPO's ``dpo.rpo_alpha = 1.0``);
3. the task's presets for that trainer (``TaskSpec.presets["code"][trainer]``), then with
   ``preset="paper"`` the paper's differences (``TaskSpec.presets["paper"][trainer]``, spec §13
   items 5-6). A task without presets keeps the generic defaults (one notice is logged; a debate
   task also restarts SFT from the base model, spec §5 item 8). The task's own reward thresholds
   (``TaskSpec.reward``) apply to the run's reward;
4. the reward preset (:data:`REWARD_PRESETS`: ``code`` keeps the reference's special cases,
   ``paper`` is Eq. 1 alone), then with ``preset="paper"`` the paper's algorithm switches
   (:data:`FIDELITY_PRESETS`, spec §13 items 1, 2, 3, 7, 8 and 12; ``docs/fidelity.md`` lists
   every point, its two values and its test);
5. the compute profile (:data:`PROFILES`: ``paper`` keeps the spec's sizes; ``cpu`` shrinks every
   size to minutes on 2 CPU cores, with LoRA; :data:`optima_trainers.presets.CPU_ENGINE` is the
   CTranslate2 alternative, not the default: see its docstring), then the backend's extras for
   that profile;
6. explicit overrides (CLI flags and ``--set``); a reward weight set here reaches the tree reward
   too, dropping a recipe's ``tree.lambda_*`` (:attr:`TreeSearchConfig.lambda_token`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from optima_env.configtree import (
    ConfigError,
    apply,
    check_number,
    check_positive_int,
    from_dict,
    leaves,
    to_dict,
)
from optima_env.reward import RewardConfig
from optima_trainers.dpo import DPOTrainConfig
from optima_trainers.presets import FIDELITY_PRESETS, PROFILES, REWARD_PRESETS
from optima_trainers.selection import SelectionConfig
from optima_trainers.sft import SFTTrainConfig

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
class GenerationConfig:
    """How the host samples conversations (every stage; the tree search takes its caps from here)."""

    instances: int = 8
    """Training instances per sampled stage (``sample_count``); the cursor continues and wraps."""
    num_samples: int = 4
    """Conversations sampled per instance (N, ``explore_count``)."""
    max_turns: int = 10
    """Turns per conversation (and the tree search's depth)."""
    max_new_tokens: int = 256
    """Generation cap of one turn in tokens."""
    temperature: float = 0.7
    """Sampling temperature after the initialization (and of the tree search)."""
    init_temperature: float = 0.3
    """Sampling temperature of the initialization (0.3 IE/ARC/MMLU, 0.7 GSM8K/MATH; spec §4)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    diverse_init: bool = True
    """The initialization samples with the format-diverse prompt pool (when the task has one)."""
    backend: Literal["hf", "vllm", "ct2"] = "hf"
    """Generation backend: transformers, vLLM, or CTranslate2 (the fast CPU engine)."""
    compute_type: Literal["int8", "int8_float32", "float32"] = "int8"
    """CTranslate2's weight type (``backend="ct2"`` only; int8 is the CPU default)."""
    concurrency: int = 32
    """Conversations in flight (the generation batch size)."""
    vllm_tensor_parallel_size: int = 1
    """``backend="vllm"``: GPUs one engine shards the model over (vLLM's ``tensor_parallel_size``)."""
    vllm_data_parallel_size: int = 1
    """``backend="vllm"``: engine replicas (``data_parallel_size``); vLLM's offline engine takes 1
    only (one rank per process), so more is refused with what to do instead (README "Scaling out")."""
    vllm_gpu_memory_utilization: float = 0.9
    """``backend="vllm"``: share of each GPU's memory vLLM may take (on CPUs: of host memory)."""
    stop_at_speaker_tags: bool = False
    """Cut a turn where it starts writing an agent's ``"Name:"`` tag. The reference code does not
    (it penalizes impersonation afterwards); the cpu profile does, because a 135M model speaks for
    its partner in most turns, and the -10 penalty would leave nothing to select."""
    message_format: Literal["code", "alternating"] = "code"
    """Roles of the turns in prompts and training examples (``code``: all ``assistant``)."""
    termination: Literal["repeat", "all_agents"] = "repeat"
    """When a conversation ends by agreement (spec §13 item 12): the same answer twice in a row
    among answer-bearing turns (``repeat``, the reference) or every agent's latest answer the
    same (``all_agents``, the paper)."""
    agent_models: Mapping[str, str] = field(default_factory=dict)
    """Roles that speak with a fixed model and do not train, e.g. ``{"Bob": "embedded"}`` (agent ->
    ``embedded``, a Hugging Face name, a folder or a checkpoint). The other roles speak with the
    model being trained, and only their turns train (SFT examples, DPO pairs)."""

    def __post_init__(self) -> None:
        for name in ("instances", "num_samples", "max_turns", "max_new_tokens", "concurrency"):
            check_positive_int(f"generation.{name}", getattr(self, name))
        for name in ("temperature", "init_temperature"):
            check_number(f"generation.{name}", getattr(self, name), low=0.0)
        check_number("generation.top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        for name in ("vllm_tensor_parallel_size", "vllm_data_parallel_size"):
            check_positive_int(f"generation.{name}", getattr(self, name))
        check_number(
            "generation.vllm_gpu_memory_utilization",
            self.vllm_gpu_memory_utilization,
            low=0.0,
            high=1.0,
            low_open=True,
        )

    def stops(self, agents: Sequence[str]) -> tuple[str, ...]:
        """Stop strings of every generated turn, sampled or tree (the agents' ``"Name:"`` tags when
        :attr:`stop_at_speaker_tags`, else none)."""
        from optima_env.policy import speaker_stops

        return speaker_stops(agents) if self.stop_at_speaker_tags else ()

    def policy_options(self) -> dict[str, Any]:
        """The backend's own keyword arguments for :func:`optima_env.backends.loading.load_policy`
        (``vllm``: its scale switches; the other backends take none from here)."""
        if self.backend != "vllm":
            return {}
        return {
            "tensor_parallel_size": self.vllm_tensor_parallel_size,
            "data_parallel_size": self.vllm_data_parallel_size,
            "gpu_memory_utilization": self.vllm_gpu_memory_utilization,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeSearchConfig:
    """Tree-search stages (spec §6): the token normalizer, the MCTS turn trees and the pair rules;
    the one declaration of these settings, read by the CLI, :func:`optima_trainers.mcts.build_trees`
    and :class:`optima_trainers.tree.Tree` alike. Sampling caps, temperature, depth (``max_turns``),
    termination and message format come from ``generation``; the reward from ``reward``
    (:meth:`reward_of`)."""

    instances: int = 10000
    """Instances (one tree each) per stage (``monte_sample_count``)."""
    normalizer_instances: int = 100
    """Fresh instances played once each to set the token normalizer (spec §6.3)."""
    normalizer: Literal["percentile", "instance_max"] = "percentile"
    """The tree reward's token normalizer (spec §13 item 3): the constant percentile of fresh
    conversations (``percentile``, the reference) or the per-instance max over the tree's rollouts
    so far (``instance_max``, the paper; no normalizer conversations are played)."""
    normalizer_percentile: float = 85.0
    """Percentile of their token counts, plus 1 (iDPO 85, iSFT-DPO 80)."""
    normalizer_rounding: Literal["int", "float"] = "int"
    """``int``: ``int(percentile) + 1`` as the reference computes it; ``float``: unrounded + 1."""
    selections: int = 8
    """Select-simulate-back-propagate rounds per tree."""
    rollouts: int = 3
    """Conversations played from each selected node."""
    top_k: int = 10
    """Candidates (by value) the softmax selection samples from."""
    select_edit_threshold: float = 0.25
    """A candidate this close to an already selected node (``ed / (max len + 1)``) is dropped."""
    merge_edit_threshold: float = 0.1
    """A new turn this close to an existing sibling (``ed / (len(new) + 1)``) is merged into it."""
    edit_distance: Literal["plus_one", "max_length"] = "plus_one"
    """Edit-distance normalization (spec §13 item 8): the reference's ``+ 1`` forms above, or the
    paper's division by the longer length (both the filter and the merge)."""
    depth_cut: Literal["error", "last_answer"] = "error"
    """A rollout cut at the depth limit without agreement: final answer ``"error"`` (the reference,
    scored by the task), or its current answer."""
    filtered_parents: Literal["drop", "keep"] = "drop"
    """A node the selection's similarity filter removed is never a pair parent unless it was
    selected (``drop``, the reference), or stays one (``keep``)."""
    minmax: Literal["exact", "code"] = "code"
    """How pairs pick the max/min-value child: as tracked during back-propagation (``code``, the
    reference; can be stale) or recomputed from the final values (``exact``)."""
    pair_rule: Literal["per_parent", "shared_ancestor"] = "per_parent"
    """Pairs (spec §13 item 7): each node's best vs worst child (``per_parent``, the reference), or
    every two children of a node, which share its whole history (``shared_ancestor``, the paper)."""
    lambda_token: float | None = None
    """The tree reward's own λ_token, where a recipe gives the tree search a weight other than the
    run's (spec §6.5 Table 8: ARC-C's iDPO trees use 0.4 where its iSFT initialization uses 0.5).
    ``None`` (the default): ``reward.lambda_token``. Setting ``reward.lambda_token`` yourself (a
    ``--set``, a flag or ``overrides``) also clears a recipe's value here, so that your weight
    reaches every reward of the run; set both to keep them apart."""
    lambda_loss: float | None = None
    """The tree reward's own λ_loss (as :attr:`lambda_token`); ``None``: ``reward.lambda_loss``."""
    theta_filter: float = 0.4
    """θ_dpo-filter: minimum value of the chosen node."""
    theta_diff: float = 0.2
    """θ_dpo-diff: minimum value gap of a pair."""
    pair_fraction: float = 0.5
    """Pairs kept per tree (the top ones by chosen value)."""
    min_pair_visits: int = 1
    """A child with fewer visits (trajectories through it) is no pair side, so that a pair's values
    are means over that many rollouts, not one conversation's reward; 1: every child (reference)."""
    pair_task_credit: bool = False
    """Keep a pair only when its chosen side's task credit (the mean task term of the trajectories
    through it) exceeds the rejected side's: the DPO counterpart of ``selection.min_task_score``.
    False: values alone decide (reference). Capped turns follow ``sft.train_capped_turns``."""

    def __post_init__(self) -> None:
        for name in ("instances", "normalizer_instances", "selections", "rollouts", "top_k"):
            check_positive_int(f"tree.{name}", getattr(self, name))
        check_number("tree.normalizer_percentile", self.normalizer_percentile, low=0.0, high=100.0)
        for name in ("select_edit_threshold", "merge_edit_threshold"):
            check_number(f"tree.{name}", getattr(self, name), low=0.0)
        check_number("tree.theta_filter", self.theta_filter)
        check_number("tree.theta_diff", self.theta_diff, low=0.0)
        check_number("tree.pair_fraction", self.pair_fraction, low=0.0, high=1.0, low_open=True)
        check_positive_int("tree.min_pair_visits", self.min_pair_visits)
        for name in ("lambda_token", "lambda_loss"):
            if getattr(self, name) is not None:
                check_number(f"tree.{name}", getattr(self, name), low=0.0)

    def reward_of(self, run: RewardConfig) -> RewardConfig:
        """The reward of tree trajectories, derived from the run's reward ``run``: the same weights
        and special cases, except that an impersonating turn zeroes the task term
        (``impersonation="mcts"``, the reference's tree-search scoring, spec §3) where the run's
        reward subtracts 10 (``"sft"``), and this section's weights where they are set. The token
        normalizer is the tree stage's (:attr:`normalizer`)."""
        changes: dict[str, Any] = {}
        if run.impersonation == "sft":
            changes["impersonation"] = "mcts"
        for name in ("lambda_token", "lambda_loss"):
            if getattr(self, name) is not None:
                changes[name] = getattr(self, name)
        return dataclasses.replace(run, **changes) if changes else run


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
    profile: Literal["cpu", "paper"] = "cpu"
    """Which compute profile sized the run."""
    family: str = "information_exchange"
    """Task family (from its ``TaskSpec``)."""
    iterations: int = 2
    """isft: iterations including the initialization; idpo: DPO iterations after it; isft-dpo: cycles."""
    split: str = "train"
    """Split the training instances come from (taken in order, cursor wraps)."""
    task_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the task factory (e.g. ``{"hops": 3}``)."""
    dtype: str = "float32"
    """Model dtype (``float32`` on CPUs without bf16)."""
    report_to: Literal["none", "tensorboard", "trackio", "wandb"] = "none"
    """Where TRL reports training metrics, and the host loop each stage's metrics (score, tokens
    per agent, reward terms, selection and training summaries): :mod:`optima_trainers.tracking`."""
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
        """Rebuild from :meth:`to_dict` output; unknown keys raise :class:`ConfigError`. A config
        written before the tree reward was derived from ``reward`` (a ``tree.reward`` section) is
        read as the same run (:func:`_upgrade`)."""
        return from_dict(cls, _upgrade(data))

    def replace(self, **overrides: Any) -> TrainConfig:
        """A copy with dotted overrides applied (``replace(**{"reward.lambda_token": 0.4})``)."""
        return apply(self, overrides)


_RUN_FIELDS = ("task", "trainer", "preset", "profile", "family")


def _upgrade(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A stored config with the former ``tree.reward`` section, as today's fields: its weights
    become ``tree.lambda_*`` where they differ from ``reward``'s; every other field must equal what
    :meth:`TreeSearchConfig.reward_of` derives, or the run cannot be read as the same run."""
    tree = data.get("tree") if isinstance(data, Mapping) else None
    if not isinstance(tree, Mapping) or "reward" not in tree:
        return data
    old, tree = dict(tree["reward"] or {}), {k: v for k, v in tree.items() if k != "reward"}
    run = from_dict(RewardConfig, data.get("reward") or {}, prefix="reward.")
    for name in ("lambda_token", "lambda_loss"):
        if name in old and old[name] != getattr(run, name):
            tree[name] = old[name]
    derived = to_dict(from_dict(TreeSearchConfig, tree, prefix="tree.").reward_of(run))
    differing = sorted(k for k, v in old.items() if derived.get(k) != v)
    if differing:
        raise ConfigError(
            f"this stored config's tree.reward differs from the run's reward in {differing}, which a "
            "config can no longer express (the tree reward derives from reward.*, spec §3); start a "
            "new run folder"
        )
    return {**data, "tree": tree}


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


def _task_presets(task: Any, trainer: str, preset: str, family: str) -> dict[str, Any]:
    presets = getattr(task, "presets", None) or {}
    code = dict(presets.get("code", {}).get(trainer, {}))
    if not code:
        logger.warning(
            "task %r has no %r preset for trainer %r: training with the generic defaults "
            "(optima_trainers.config; set TaskSpec.presets to give the task its own)",
            getattr(task, "id", task),
            "code",
            trainer,
        )
        if family == DEBATE:
            code["sft.restart_from_base"] = True  # spec §5 item 8: debate SFT restarts from the base
    if preset == "paper":
        code.update(presets.get("paper", {}).get(trainer, {}))
    return code


def resolve_config(
    task: Any,
    trainer: Any,
    *,
    preset: Literal["code", "paper"] = "code",
    profile: Literal["cpu", "paper"] = "cpu",
    overrides: Mapping[str, Any] | None = None,
    **run: Any,
) -> TrainConfig:
    """A full :class:`TrainConfig` (the layers of the module docstring), validated.

    Args:
        task: the task's :class:`~optima_env.specs.TaskSpec` (its id, family, presets and reward
            thresholds are used), or a task id, looked up in a fresh plugin manager.
        trainer: the backend's :class:`~optima_env.specs.TrainerSpec`, or a trainer name.
        preset: ``code`` (the task's recipes, default) or ``paper`` (the paper's tables).
        profile: ``cpu`` (minutes on 2 cores, LoRA) or ``paper`` (the spec's sizes).
        overrides: dotted names to values (strings are parsed into the field's type).
        run: top-level fields (``model``, ``seed``, ``iterations``, ``task_kwargs``, ...), applied
            last like ``overrides``; ``None`` values are ignored.

    Raises:
        ConfigError: an unknown name, a value of the wrong type, or one out of range (a bad
            ``reward.lambda_token`` or ``selection.theta`` fails here, before any generation).
    """
    if isinstance(task, str) or isinstance(trainer, str):
        from optima_env.registry import get_plugin_manager, task_specs, trainer_specs

        pm = get_plugin_manager()
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
        _task_presets(task, trainer.name, preset, task.family),
        _task_reward(task.reward),
        REWARD_PRESETS[reward_preset],
        FIDELITY_PRESETS[preset],  # spec §13: the paper's algorithm switches under preset="paper"
        PROFILES[profile],
        dict(trainer.profiles.get(profile, {})),
    ]
    user = {**given, **{k: v for k, v in run.items() if v is not None}}
    layers += [given, {k: v for k, v in run.items() if v is not None}, _user_reward_reaches_trees(layers, user)]
    config = TrainConfig(
        task=task.id, trainer=trainer.name, preset=preset, profile=profile, family=task.family
    )
    options: dict[str, Any] = {}
    for layer in layers:
        plain = {k: v for k, v in layer.items() if not k.startswith("options.")}
        options.update({k[len("options.") :]: v for k, v in layer.items() if k.startswith("options.")})
        config = apply(config, plain)
    return check_options(config, trainer, options)


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
