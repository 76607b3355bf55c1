"""Trainer backends: the contract (:class:`TrainerBackend`, :class:`StageContext`) and the three
built-in ones.

A backend is built by its :class:`~optima_env.specs.TrainerSpec`'s factory (discovery stays the
``optima_register_trainers`` hook). The host loop (:class:`~optima_trainers.host.loop.IterativeTrainer`)
holds it and calls it: :meth:`TrainerBackend.stages` once per run, then for each stage, after
generating, scoring, selecting and persisting the stage's data itself,
:meth:`TrainerBackend.train` with that data and one :class:`StageContext`. Generation, scoring and
resume stay in the host, so a backend only says what to generate and how to train on it. The host
also registers the backend on the run's plugin manager, so a backend may observe the training
events (:mod:`optima_trainers.hookspecs`) like any plugin.

Built in (registered by :mod:`optima_trainers.backends.builtin`, like a third party's):

* ``isft`` (:class:`ISFTBackend`): SFT stages ``iter_00`` (initialization, spec §4) to
  ``iter_{K-1}`` on the selected trajectories (both agents' views, own turns unmasked);
* ``idpo`` (:class:`IDPOBackend`): the iSFT initialization ``iter_00``, then tree stages
  ``iter_01`` .. ``iter_K`` trained with RPO (DPO + NLL, ``dpo.rpo_alpha`` = 1) from the current
  model, which is also the reference (spec §6);
* ``isft-dpo`` (:class:`ISFTDPOBackend`): per cycle an SFT stage ``iter_XX_sft`` then a plain-DPO
  tree stage ``iter_XX_dpo`` (spec §7).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from optima_env.errors import require
from optima_env.task import Task
from optima_trainers.config.train import TrainConfig
from optima_trainers.run.stages import Stage, StageData, StageOutcome

__all__ = [
    "IDPOBackend",
    "ISFTBackend",
    "ISFTDPOBackend",
    "StageContext",
    "TrainerBackend",
    "sft_stages",
    "train_dpo_stage",
    "train_sft_stage",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageContext:
    """What the host hands a backend to train one stage, besides the stage's data."""

    config: TrainConfig
    """The run's configuration."""
    task: Task
    """The run's task (built once by the host, with ``config.task_kwargs``)."""
    stage: Stage
    """The stage to train."""
    start_model: str
    """The model the stage trains from (the previous stage's result, or the base model)."""
    base_model: str
    """The run's starting model, resolved to a folder (the frozen readability model by default)."""
    output_dir: Path
    """Where the checkpoint goes; it must appear complete or not at all
    (:func:`optima_trainers.run.checkpoint.atomic_checkpoint`). The host does not call
    :meth:`TrainerBackend.train` when a complete checkpoint is already there (a resumed run)."""
    events: Any
    """The run's hook relay (``pm.hook``): an online backend fires
    ``events.optima_episode_scored(episode=..., stage=...)`` for the conversations it plays."""
    load_policy: Callable[[str], Any]
    """A :class:`~optima_env.policy.ChatPolicy` of a model folder with the run's generation backend
    and sizes (``config.generation``)."""
    readability: Callable[[], Callable[[Sequence[str]], Sequence[float]]]
    """The frozen base model's per-turn LM loss (``readability_scorer``), loaded on first call and
    shared with the host's scoring (one copy per run)."""


class TrainerBackend(abc.ABC):
    """The trainer-backend contract: a backend declares its stages and trains one stage at a time.

    Subclasses set :attr:`name` and implement :meth:`stages` and :meth:`train`; the host calls
    them directly. A backend keeps no host state: everything a stage needs comes with the call.
    """

    name: ClassVar[str] = ""
    """The registered name (``--trainer``)."""
    config: TrainConfig
    """The run's configuration (as the factory received it)."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config

    @abc.abstractmethod
    def stages(self, config: TrainConfig) -> list[Stage]:
        """The stages of a run, in order (names unique; the host validates them)."""

    @abc.abstractmethod
    def train(self, data: StageData, context: StageContext) -> StageOutcome:
        """Train ``context.stage`` from ``context.start_model`` on ``data`` (what the host generated
        and persisted for it); write the checkpoint to ``context.output_dir``."""


def sft_stages(config: TrainConfig, count: int, *, start: int = 0, suffix: str = "") -> list[Stage]:
    """``count`` sampled SFT stages; the first of the run is the initialization (base model)."""
    out = []
    for i in range(start, start + count):
        init = i == 0
        restart = init or config.sft.restart_from_base
        out.append(
            Stage(
                name=f"iter_{i:02d}{suffix}",
                kind="sft",
                number=i,
                generate="samples",
                init=init,
                start="base" if restart else "previous",
            )
        )
    return out


def train_sft_stage(data: StageData, context: StageContext) -> StageOutcome:
    """SFT on ``data.selected`` (both agents' views, own turns unmasked; spec §5 items 5-7)."""
    from optima_trainers.sft.data import build_sft_examples
    from optima_trainers.sft.trainer import train_sft

    transformers = require("transformers", "train")
    config, start_model = context.config, context.start_model
    tokenizer = transformers.AutoTokenizer.from_pretrained(start_model)
    examples, counts = build_sft_examples(
        data.selected,
        tokenizer,
        message_format=config.generation.message_format,
        max_length=config.sft.max_length,
        seed=config.seed,
        max_turn_tokens=None if config.sft.train_capped_turns else config.generation.max_new_tokens,
    )
    fixed = set(config.generation.agent_models)  # roles that speak with a fixed model do not train
    if fixed:
        examples = [e for e in examples if e.agent not in fixed]
        counts = {
            **counts,
            "examples": len(examples),
            "skipped_fixed_role": counts["examples"] - len(examples),
        }
    metrics = {f"train/{k}": float(v) for k, v in counts.items()}
    if not examples:
        logger.warning(
            "%s: no training example was selected; the model carries over unchanged", data.folder.name
        )
        return StageOutcome(result=None, metrics=metrics)
    held_out = int(config.sft.eval_fraction * len(examples))
    result = train_sft(
        model_path=start_model,
        examples=examples[held_out:],
        eval_examples=examples[:held_out],
        config=config.sft,
        output_dir=context.output_dir,
        logging_dir=data.folder / "trainer",
        seed=config.seed,
        dtype=config.dtype,
        report_to=config.report_to,
    )
    return StageOutcome(result=result, metrics=metrics)


def train_dpo_stage(data: StageData, context: StageContext) -> StageOutcome:
    """DPO (RPO with ``dpo.rpo_alpha``) from ``context.start_model``, also the reference, on
    ``data.pairs``."""
    from optima_trainers.dpo.trainer import train_dpo

    config = context.config
    fixed = set(config.generation.agent_models)  # a pair at a fixed role's turn does not train
    pairs = [p for p in data.pairs if p.agent not in fixed]
    if not pairs:
        logger.warning(
            "%s: no preference pair passed the filters; the model carries over unchanged", data.folder.name
        )
        return StageOutcome(result=None)
    result = train_dpo(
        model_path=context.start_model,
        pairs=pairs,
        config=config.dpo,
        output_dir=context.output_dir,
        report_to=config.report_to,
        trainer_dir=data.folder / "trainer",
        seed=config.seed,
        dtype=config.dtype,
    )
    return StageOutcome(result=result)


class _BuiltinBackend(TrainerBackend):
    def train(self, data: StageData, context: StageContext) -> StageOutcome:
        if context.stage.generate == "samples":
            from optima_trainers.sft.selection import empty_selection_error, no_task_credit_warning

            if data.episodes and not data.selected:  # iSFT trains on the selection: nothing to learn from
                selection = {**context.config.selection.to_dict(), "stage": context.stage.name}
                raise empty_selection_error(data.episodes, selection)
            warning = no_task_credit_warning(data.selected, context.stage.name)
            if warning is not None:
                logger.warning(warning)
            return train_sft_stage(data, context)
        return train_dpo_stage(data, context)


class ISFTBackend(_BuiltinBackend):
    """Iterative SFT (spec §5): ``iterations`` SFT stages, the first the initialization."""

    name = "isft"

    def stages(self, config: TrainConfig) -> list[Stage]:
        return sft_stages(config, config.iterations)


class IDPOBackend(_BuiltinBackend):
    """Iterative DPO (spec §6): the iSFT initialization, then ``iterations`` tree/RPO stages."""

    name = "idpo"

    def stages(self, config: TrainConfig) -> list[Stage]:
        trees = [
            Stage(name=f"iter_{i:02d}", kind="dpo", number=i, generate="tree")
            for i in range(1, config.iterations + 1)
        ]
        return sft_stages(config, 1) + trees


class ISFTDPOBackend(_BuiltinBackend):
    """iSFT-DPO (spec §7): ``iterations`` cycles of one SFT stage and one plain-DPO tree stage."""

    name = "isft-dpo"

    def stages(self, config: TrainConfig) -> list[Stage]:
        out: list[Stage] = []
        for c in range(config.iterations):
            (sft,) = sft_stages(config, 1, start=c, suffix="_sft")
            out.append(Stage(name=sft.name, kind="sft", number=2 * c, init=sft.init, start=sft.start))
            out.append(Stage(name=f"iter_{c:02d}_dpo", kind="dpo", number=2 * c + 1, generate="tree"))
        return out
