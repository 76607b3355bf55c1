"""Run configuration and per-task presets (spec §5-§7 tables, §13).

:func:`resolve_config` builds a :class:`TrainConfig` in four layers, later ones winning:

1. the field defaults below;
2. the task preset of the chosen trainer: the reference code's recipes (``preset="code"``,
   default) or the paper's Table 8 values (``preset="paper"``; the §13 item 5-6 differences);
3. a compute profile: ``paper`` keeps the spec's sizes (10,000 instances, 10 samples, full
   fine-tuning, 2,000-token turns); ``cpu`` shrinks every size to minutes on 2 CPU cores and
   switches to LoRA with a LoRA-sized learning rate;
4. explicit overrides (the CLI flags).

Presets are keyed by dataset (``hotpotqa``, ``2wmh``, ``triviaqa``, ``cbt``, ``math``, ``gsm8k``,
``arc``, ``mmlu``, ``synth``), found from the task id by :func:`preset_key`. A task without a
preset gets its family's defaults (a warning says so).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from optima_env.errors import TaskContractError

__all__ = [
    "PRESET_KEYS",
    "TRAINERS",
    "TrainConfig",
    "preset_key",
    "preset_values",
    "resolve_config",
]

logger = logging.getLogger(__name__)

TRAINERS = ("isft", "idpo", "isft-dpo")
DEBATE = "debate"

# -- preset tables (code recipes; spec §5, §6, §7) ---------------------------------------------------
# iSFT: lr, epochs, batch, λ_token, λ_loss, θ_sft, N, instances/iteration (Table 8 = recipes)
_ISFT = {
    "hotpotqa": (2e-5, 3, 32, 0.6, 1.0, 0.5, 10, 10000),
    "2wmh": (2e-5, 2, 32, 0.6, 1.0, 0.5, 10, 10000),
    "triviaqa": (2e-5, 3, 32, 0.6, 1.0, 0.5, 10, 10000),
    "cbt": (2e-5, 2, 32, 0.6, 1.0, 0.5, 10, 10000),
    "math": (1e-6, 3, 16, 0.4, 0.8, 0.6, 10, 7500),
    "gsm8k": (2e-6, 3, 16, 0.4, 0.9, 0.6, 10, 7000),
    "arc": (1e-6, 4, 16, 0.5, 0.6, 0.6, 15, 2000),
    "mmlu": (1e-6, 2, 16, 0.6, 0.7, 0.6, 10, 10000),
    "synth": (2e-5, 1, 8, 0.6, 1.0, -0.5, 4, 8),
}
# synth θ_sft = -0.5 (and θ_filter = -1, θ_diff = 0.05 below): the embedded 135M model gets no F1 on
# it and often repeats a turn (readability term 0), so its rewards are negative; the paper's
# thresholds would select nothing. These let the best of each group through (the top-70% cut and
# the top-half-per-tree cut still apply).
# iDPO: β, λ_token, λ_loss, θ_filter, θ_diff, MCTS instances/iteration, iterations after init
_IDPO = {
    "hotpotqa": (0.1, 0.6, 1.0, 0.4, 0.2, 13000, 5),
    "2wmh": (0.5, 0.6, 1.0, 0.4, 0.2, 12000, 5),
    "triviaqa": (0.5, 0.6, 1.0, 0.4, 0.2, 10000, 5),
    "cbt": (0.1, 0.6, 1.0, 0.4, 0.2, 13000, 5),
    "math": (0.1, 0.5, 0.7, 0.4, 0.2, 7000, 5),
    "gsm8k": (0.25, 0.6, 0.7, 0.5, 0.2, 7000, 5),
    "arc": (0.2, 0.4, 0.7, 0.45, 0.2, 10000, 2),
    "mmlu": (0.1, 0.6, 0.7, 0.4, 0.2, 10000, 5),
    "synth": (0.1, 0.6, 1.0, -1.0, 0.05, 2, 1),
}
# iSFT-DPO: SFT lr, SFT epochs, SFT batch, β, λ_token, λ_loss, θ_sft, θ_filter, SFT inst, DPO inst, cycles
_ISFT_DPO = {
    "hotpotqa": (2e-5, 2, 32, 0.1, 0.6, 1.0, 0.5, 0.4, 10000, 12000, 3),
    "2wmh": (2e-5, 1, 32, 0.5, 0.6, 1.0, 0.5, 0.4, 10000, 12000, 3),
    "triviaqa": (2e-5, 1, 32, 0.7, 0.6, 1.0, 0.6, 0.43, 10000, 12000, 3),
    "cbt": (2e-5, 1, 32, 0.7, 0.6, 1.0, 0.5, 0.4, 10000, 12000, 3),
    "math": (1e-6, 4, 32, 0.1, 0.4, 0.9, 0.6, 0.45, 7000, 7000, 3),
    "gsm8k": (1e-6, 3, 16, 0.5, 0.4, 0.9, 0.6, 0.45, 7000, 7000, 3),
    "arc": (1e-6, 4, 16, 0.1, 0.5, 0.6, 0.6, 0.45, 10000, 10000, 2),
    "mmlu": (1e-6, 2, 16, 0.1, 0.6, 0.7, 0.7, 0.45, 10000, 10000, 3),
    "synth": (2e-5, 1, 8, 0.1, 0.6, 1.0, -0.5, -1.0, 8, 2, 1),
}
# The paper's Table 8 where it differs from the recipes (§13 items 5-6: paper = 6 models everywhere).
_PAPER_DIFF: dict[str, dict[str, dict[str, Any]]] = {
    "isft": {"triviaqa": {"theta_sft": 0.6}, "math": {"sft_lambda_loss": 0.9}},
    "idpo": {"gsm8k": {"dpo_beta": 0.2, "theta_filter": 0.4}, "arc": {"iterations": 5}},
    "isft-dpo": {
        "hotpotqa": {"dpo_beta": 0.5},
        "triviaqa": {"theta_filter": 0.4},
        "math": {"theta_filter": 0.4},
        "gsm8k": {"theta_filter": 0.4},
        "mmlu": {"theta_sft": 0.6, "theta_filter": 0.4},
        "arc": {"iterations": 3},
    },
}
_DEBATE_KEYS = {"math", "gsm8k", "arc", "mmlu"}
PRESET_KEYS = tuple(_ISFT)
_ALIASES = {
    "hotpotqa": "hotpotqa",
    "hotpot": "hotpotqa",
    "2wmh": "2wmh",
    "2wiki": "2wmh",
    "2wikimultihopqa": "2wmh",
    "twowiki": "2wmh",
    "mwhqa": "2wmh",
    "triviaqa": "triviaqa",
    "trivialqa": "triviaqa",
    "cbt": "cbt",
    "cbtcn": "cbt",
    "math": "math",
    "gsm8k": "gsm8k",
    "arc": "arc",
    "arcc": "arc",
    "arcchallenge": "arc",
    "mmlu": "mmlu",
    "synth": "synth",
}

# -- compute profiles -----------------------------------------------------------------------------
_PROFILE_PAPER: dict[str, Any] = dict(
    max_turns=10, max_new_tokens=2000, sft_max_length=2048, dpo_max_length=4096,
    per_device_batch_size=1, lora=False, normalizer_instances=100, concurrency=64, eval_fraction=0.02,
    dpo_lr=5e-7, dpo_batch_size=64, warmup_ratio=0.1,
)  # fmt: skip
_PROFILE_CPU: dict[str, Any] = dict(
    instances=6, num_samples=3, max_turns=4, max_new_tokens=32, stop_at_speaker_tags=True,
    sft_max_length=1024, dpo_max_length=1024, per_device_batch_size=2, sft_batch_size=8,
    dpo_batch_size=8, lora=True,
    sft_lr=1e-4, sft_epochs=1, dpo_lr=5e-5, normalizer_instances=8, mcts_instances=2,
    mcts_selections=4, mcts_rollouts=2, concurrency=32, eval_fraction=0.0, warmup_ratio=0.0,
)  # fmt: skip
_CPU_ITERATIONS = {"isft": 2, "idpo": 1, "isft-dpo": 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    """Everything one training run needs (stored as ``config.json`` in the run folder)."""

    task: str
    """Resolved task id (``ie/synth-v0``)."""
    trainer: Literal["isft", "idpo", "isft-dpo"]
    """Training variant."""
    model: str = "embedded"
    """Starting model: ``embedded``, a Hugging Face name or a local folder."""
    readability_model: str | None = None
    """Frozen model of the readability term (default: ``model``, the base model)."""
    seed: int = 0
    """Seed of everything (episodes, sampling, shuffling, training)."""
    preset: Literal["code", "paper"] = "code"
    """Which hyperparameter table was applied (recipes or paper, spec §13)."""
    profile: Literal["cpu", "paper"] = "cpu"
    """Which compute profile sized the run."""
    family: str = "information_exchange"
    """Task family; debate tasks restart SFT from the base model every iteration."""
    iterations: int = 2
    """isft: iterations including the initialization; idpo: DPO iterations after it; isft-dpo: cycles."""
    split: str = "train"
    """Split the training instances come from (taken in order, cursor wraps)."""
    task_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the task factory (e.g. ``{"hops": 3}``)."""
    # generation
    instances: int = 8
    """Instances per SFT iteration (``sample_count``)."""
    num_samples: int = 4
    """Conversations sampled per instance (N, ``explore_count``)."""
    max_turns: int = 10
    """Turns per conversation (and MCTS depth)."""
    max_new_tokens: int = 256
    """Generation cap of one turn in tokens."""
    temperature: float = 0.7
    """Sampling temperature after the initialization."""
    init_temperature: float = 0.3
    """Sampling temperature of the initialization (0.3 IE/ARC/MMLU, 0.7 GSM8K/MATH; spec §4)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    diverse_init: bool = True
    """Initialization samples with the format-diverse prompt pool (when the task has one)."""
    backend: Literal["hf", "vllm"] = "hf"
    """Generation backend."""
    concurrency: int = 32
    """Conversations in flight (the generation batch size)."""
    stop_at_speaker_tags: bool = False
    """Cut a turn where it starts writing an agent's ``"Name:"`` tag. The reference code does not
    (it penalizes impersonation afterwards); the cpu profile does, because a 135M model speaks for
    its partner in most turns, and the -10 penalty would leave nothing to select."""
    message_format: Literal["code", "alternating"] = "code"
    """Roles of the turns in prompts and training examples (``code``: all ``assistant``)."""
    # reward and selection (SFT)
    reward_preset: Literal["code", "paper"] = "code"
    """Reward special cases (``optima_env.reward.RewardConfig.preset``)."""
    sft_lambda_token: float = 0.6
    """λ_token of the iSFT reward."""
    sft_lambda_loss: float = 1.0
    """λ_loss of the iSFT reward."""
    theta_sft: float = 0.5
    """θ_sft: minimum total reward of a selected trajectory."""
    keep: tuple[float, float] = (0.0, 0.7)
    """Slice of the ranked instances kept (MATH: 0.1-0.8)."""
    min_task_score: float | None = None
    """When set, iSFT selects only among trajectories with at least this task score (not in the
    paper; see :class:`~optima_trainers.selection.SelectionConfig`)."""
    selection_order: Literal["code", "paper"] = "code"
    """``code``: top 70% then θ; ``paper``: θ then 70% of the survivors."""
    restart_from_base: bool = False
    """SFT starts from the base model every iteration (debate tasks) instead of the last model."""
    # SFT training
    lora: bool = True
    """LoRA (merged into the weights at save) instead of full fine-tuning."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA alpha."""
    sft_lr: float = 2e-5
    """SFT learning rate."""
    sft_epochs: float = 1
    """SFT epochs per iteration."""
    sft_batch_size: int = 32
    """Effective SFT batch (per-device batch × accumulation × processes)."""
    per_device_batch_size: int = 1
    """Examples per device per forward pass (SFT; DPO pairs)."""
    sft_max_length: int = 2048
    """Longest SFT example in tokens (longer ones are cut at the end)."""
    max_steps: int | None = None
    """Cap on optimizer steps per training stage (tests, smoke runs)."""
    eval_fraction: float = 0.0
    """Fraction of SFT examples held out for evaluation (code: 0.02)."""
    warmup_ratio: float = 0.1
    """Linear warm-up fraction before the cosine schedule (cpu profile: 0, runs take few steps)."""
    report_to: Literal["none", "tensorboard", "wandb"] = "none"
    """Where TRL reports training metrics."""
    # DPO / MCTS
    dpo_lambda_token: float = 0.6
    """λ_token of the MCTS reward."""
    dpo_lambda_loss: float = 1.0
    """λ_loss of the MCTS reward."""
    dpo_beta: float = 0.1
    """DPO β."""
    rpo_alpha: float | None = None
    """NLL weight of the RPO loss (iDPO 1.0; iSFT-DPO plain DPO: ``None``)."""
    dpo_lr: float = 5e-7
    """DPO learning rate."""
    dpo_epochs: float = 1
    """DPO epochs per iteration."""
    dpo_batch_size: int = 64
    """Effective DPO batch in pairs."""
    dpo_max_length: int = 4096
    """Longest DPO sequence in tokens."""
    theta_filter: float = 0.4
    """θ_dpo-filter: minimum value of the chosen node."""
    theta_diff: float = 0.2
    """θ_dpo-diff: minimum value gap of a pair."""
    pair_fraction: float = 0.5
    """Pairs kept per tree (top by chosen value)."""
    normalizer_instances: int = 100
    """Fresh instances played once each to set the MCTS token normalizer."""
    normalizer_percentile: float = 85.0
    """Percentile of their token counts (iDPO 85, iSFT-DPO 80)."""
    mcts_instances: int = 10000
    """Instances (one tree each) per DPO iteration."""
    mcts_selections: int = 8
    """MCTS selections per tree."""
    mcts_rollouts: int = 3
    """Rollouts per selection."""
    dtype: str = "float32"
    """Model dtype (``float32`` on CPUs without bf16)."""

    def __post_init__(self) -> None:
        if self.trainer not in TRAINERS:
            raise TaskContractError(f"trainer must be one of {TRAINERS}, got {self.trainer!r}")
        for name in ("iterations", "instances", "num_samples", "max_turns", "max_new_tokens", "concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise TaskContractError(f"{name} must be an int >= 1, got {value!r}")
        if self.backend not in ("hf", "vllm"):
            raise TaskContractError(f"backend must be 'hf' or 'vllm', got {self.backend!r}")
        if self.report_to not in ("none", "tensorboard", "wandb"):
            raise TaskContractError(f"report_to must be none, tensorboard or wandb, got {self.report_to!r}")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise TaskContractError(f"eval_fraction must lie in [0, 1), got {self.eval_fraction!r}")

    @property
    def is_debate(self) -> bool:
        """True for solver/critic debate tasks."""
        return self.family == DEBATE

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = dataclasses.asdict(self)
        out["keep"] = list(self.keep)
        out["task_kwargs"] = dict(self.task_kwargs)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Rebuild from :meth:`to_dict` output; unknown keys raise :class:`TaskContractError`."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise TaskContractError(f"unknown config keys {sorted(unknown)}; known: {sorted(names)}")
        values = dict(data)
        if "keep" in values:
            values["keep"] = tuple(values["keep"])
        return cls(**values)


def preset_key(task_id: str) -> str | None:
    """The preset table key of a task id, or ``None``.

    >>> preset_key("ie/hotpotqa-v0"), preset_key("debate/arc_challenge-v1"), preset_key("x/foo-v0")
    ('hotpotqa', 'arc', None)
    """
    name = task_id.split("/")[-1]
    name = re.sub(r"-v\d+$", "", name).lower()
    compact = re.sub(r"[^a-z0-9]", "", name)
    if compact in _ALIASES:
        return _ALIASES[compact]
    for alias, key in sorted(_ALIASES.items(), key=lambda kv: -len(kv[0])):
        if compact.startswith(alias):
            return key
    return None


def preset_values(
    key: str, trainer: str, *, preset: Literal["code", "paper"] = "code", family: str | None = None
) -> dict[str, Any]:
    """The hyperparameters of one task preset for one trainer (no profile, no overrides)."""
    if trainer not in TRAINERS:
        raise TaskContractError(f"trainer must be one of {TRAINERS}, got {trainer!r}")
    if preset not in ("code", "paper"):
        raise TaskContractError(f"preset must be 'code' or 'paper', got {preset!r}")
    debate = key in _DEBATE_KEYS if family is None else family == DEBATE
    lr, ep, bs, lt, ll, th, n, inst = _ISFT[key]
    values: dict[str, Any] = dict(
        sft_lr=lr, sft_epochs=ep, sft_batch_size=bs, sft_lambda_token=lt, sft_lambda_loss=ll,
        theta_sft=th, num_samples=n, instances=inst, iterations=6,
        keep=(0.1, 0.8) if key == "math" else (0.0, 0.7),
        restart_from_base=debate,
        init_temperature=0.7 if key in ("math", "gsm8k") else 0.3,
    )  # fmt: skip
    if trainer in ("idpo", "isft-dpo"):
        if trainer == "idpo":
            beta, dlt, dll, tf, td, mcts, its = _IDPO[key]
            values.update(rpo_alpha=1.0, normalizer_percentile=85.0)
        else:
            slr, sep, sbs, beta, dlt, dll, ths, tf, sinst, mcts, its = _ISFT_DPO[key]
            td = 0.05 if key == "synth" else 0.2
            values.update(
                sft_lr=slr, sft_epochs=sep, sft_batch_size=sbs, sft_lambda_token=dlt,
                sft_lambda_loss=dll, theta_sft=ths, instances=sinst, num_samples=10 if key != "synth" else n,
                rpo_alpha=None, normalizer_percentile=80.0,
            )  # fmt: skip
        values.update(
            dpo_beta=beta, dpo_lambda_token=dlt, dpo_lambda_loss=dll, theta_filter=tf, theta_diff=td,
            mcts_instances=mcts, iterations=its,
        )  # fmt: skip
    if preset == "paper":
        values.update(_PAPER_DIFF[trainer].get(key, {}))
        if trainer == "idpo":
            values["iterations"] = 5
    return values


def resolve_config(
    task: str,
    trainer: str,
    *,
    preset: Literal["code", "paper"] = "code",
    profile: Literal["cpu", "paper"] = "cpu",
    family: str = "information_exchange",
    **overrides: Any,
) -> TrainConfig:
    """A full :class:`TrainConfig`: defaults, then task preset, then profile, then ``overrides``.

    Args:
        task: the resolved task id.
        trainer: ``isft``, ``idpo`` or ``isft-dpo``.
        preset: ``code`` (recipes, default) or ``paper`` (Table 8).
        profile: ``cpu`` (minutes on 2 cores, LoRA) or ``paper`` (the spec's sizes).
        family: the task's family (from its ``TaskSpec``).
        overrides: any :class:`TrainConfig` field; ``None`` values are ignored.
    """
    if profile not in ("cpu", "paper"):
        raise TaskContractError(f"profile must be 'cpu' or 'paper', got {profile!r}")
    key = preset_key(task)
    if key is None:
        key = "gsm8k" if family == DEBATE else "hotpotqa"
        logger.warning("no preset for task %r; using the %s preset (its family's default)", task, key)
    values = preset_values(key, trainer, preset=preset, family=family)
    values.update(_PROFILE_PAPER if profile == "paper" else _PROFILE_CPU)
    if profile == "cpu":
        values["iterations"] = _CPU_ITERATIONS[trainer]
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = set(overrides) - names
    if unknown:
        raise TaskContractError(f"unknown config fields {sorted(unknown)}; known: {sorted(names)}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(task=task, trainer=trainer, preset=preset, profile=profile, family=family, **values)  # type: ignore[arg-type]
