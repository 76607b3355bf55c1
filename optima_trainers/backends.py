"""Trainer backends: the contract (:class:`TrainerBackend`) and the three built-in ones.

A backend is a pluggy plugin object built by its :class:`~optima_env.specs.TrainerSpec`'s
factory. The host loop (:class:`~optima_trainers.loop.IterativeTrainer`) registers it on the run's
plugin manager, asks it for the run's stages (``optima_trainer_stages``), generates, scores,
selects and persists each stage's data itself, delivers it through ``optima_generation_end`` and
asks the backend to train (``optima_train_stage``). Generation, scoring and resume stay in the
host, so a backend only says what to generate and how to train on it.

Built in (registered by :mod:`optima_trainers.plugin`, like a third party's):

* ``isft`` (:class:`ISFTBackend`): SFT stages ``iter_00`` (initialization, spec §4) to
  ``iter_{K-1}`` on the selected trajectories (both agents' views, own turns unmasked);
* ``idpo`` (:class:`IDPOBackend`): the iSFT initialization ``iter_00``, then tree stages
  ``iter_01`` .. ``iter_K`` trained with RPO (DPO + NLL, ``dpo.rpo_alpha`` = 1) from the current
  model, which is also the reference (spec §6);
* ``isft-dpo`` (:class:`ISFTDPOBackend`): per cycle an SFT stage ``iter_XX_sft`` then a plain-DPO
  tree stage ``iter_XX_dpo`` (spec §7).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

from optima_env.errors import PluginError, require
from optima_env.hookspecs import hookimpl
from optima_trainers.config import TrainConfig
from optima_trainers.stages import Stage, StageData, StageOutcome

__all__ = [
    "IDPOBackend",
    "ISFTBackend",
    "ISFTDPOBackend",
    "TrainerBackend",
    "sft_stages",
    "train_dpo_stage",
    "train_sft_stage",
]

logger = logging.getLogger(__name__)


class TrainerBackend:
    """Base class of trainer backends: keeps the data the host delivers, stage by stage.

    Subclasses set :attr:`name` and implement :meth:`stages` and :meth:`train`. The hook
    implementations below route the host's calls to them; a backend may implement more hooks
    (for instance ``optima_episode_scored`` to see every episode as it is scored).
    """

    name: ClassVar[str] = ""
    """The registered name (``--trainer``)."""
    config: TrainConfig
    """The run's configuration."""
    data: dict[str, StageData]
    """Stage name -> what the host delivered for it (``optima_generation_end``)."""
    pm: Any
    """The run's plugin manager (set by the host after building the backend; an online backend
    fires ``optima_episode_scored`` on it for the conversations it plays)."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.data = {}
        self.pm = None

    def stages(self, config: TrainConfig) -> list[Stage]:
        """The stages of a run, in order."""
        raise NotImplementedError

    def train(self, stage: Stage, data: StageData, start_model: str, output_dir: Path) -> StageOutcome:
        """Train ``stage`` from ``start_model`` on ``data``; write the checkpoint to ``output_dir``."""
        raise NotImplementedError

    @hookimpl
    def optima_trainer_stages(self, config: TrainConfig) -> list[Stage]:
        return self.stages(config)

    @hookimpl
    def optima_generation_end(self, stage: Stage, data: StageData) -> None:
        self.data[stage.name] = data

    @hookimpl
    def optima_train_stage(self, stage: Stage, start_model: str, output_dir: Any) -> StageOutcome:
        if stage.name not in self.data:
            raise PluginError(
                f"backend {self.name!r} was asked to train stage {stage.name!r} but received no data "
                "for it (optima_generation_end was not delivered); is the host loop up to date?"
            )
        return self.train(stage, self.data[stage.name], start_model, Path(output_dir))


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


def train_sft_stage(config: TrainConfig, data: StageData, start_model: str, output_dir: Path) -> StageOutcome:
    """SFT on the selected trajectories (both agents' views, own turns unmasked; spec §5 items 5-7)."""
    from optima_trainers.sft import train_sft
    from optima_trainers.sft_data import build_sft_examples

    transformers = require("transformers", "train")
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
        output_dir=output_dir,
        logging_dir=data.folder / "trainer",
        seed=config.seed,
        dtype=config.dtype,
        report_to=config.report_to,
    )
    return StageOutcome(result=result, metrics=metrics)


def train_dpo_stage(config: TrainConfig, data: StageData, start_model: str, output_dir: Path) -> StageOutcome:
    """DPO (RPO with ``dpo.rpo_alpha``) from ``start_model``, also the reference, on the kept pairs."""
    from optima_trainers.dpo import train_dpo

    fixed = set(config.generation.agent_models)  # a pair at a fixed role's turn does not train
    pairs = [p for p in data.pairs if p.agent not in fixed]
    if not pairs:
        logger.warning(
            "%s: no preference pair passed the filters; the model carries over unchanged", data.folder.name
        )
        return StageOutcome(result=None)
    result = train_dpo(
        model_path=start_model,
        pairs=pairs,
        config=config.dpo,
        output_dir=output_dir,
        report_to=config.report_to,
        trainer_dir=data.folder / "trainer",
        seed=config.seed,
    )
    return StageOutcome(result=result)


class _BuiltinBackend(TrainerBackend):
    def train(self, stage: Stage, data: StageData, start_model: str, output_dir: Path) -> StageOutcome:
        if stage.generate == "samples":
            return train_sft_stage(self.config, data, start_model, output_dir)
        return train_dpo_stage(self.config, data, start_model, output_dir)


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
