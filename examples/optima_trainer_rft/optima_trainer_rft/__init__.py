"""Best-of-N rejection-sampling fine-tuning (RFT) as a third-party optima trainer backend.

An example of the trainer-backend contract (``optima_trainers.backends.contract.TrainerBackend``): it
declares its name, its own options (:class:`RFTConfig`) and its stages; the host generates and
scores N conversations per instance each stage and calls ``train(data, context)`` with them; it
trains SFT on the correct ones only: per instance, the
conversations whose task score reaches ``min_task_score``, best reward first, at most
``per_instance`` of them (rejection sampling, as in RFT / ReST; no reward threshold, no top 70%).

It also carries its own recipe for a task it was tried on (:data:`RECIPES`, registered through
``optima_register_recipes``): a trainer's per-task hyperparameters live with the trainer, and no
task has to know its name.

Install it beside optima (``pip install -e examples/optima_trainer_rft``), then::

    python -m optima_trainers.train --trainer rft --task ie/synth-v0 --set options.per_instance=2
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from optima_env import Recipe, TrainerSpec, hookimpl
from optima_trainers.backends.contract import StageContext, TrainerBackend, sft_stages, train_sft_stage
from optima_trainers.run.stages import Stage, StageData, StageOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class RFTConfig:
    """The options of the ``rft`` backend (``--set options.NAME=VALUE``)."""

    min_task_score: float = 1.0
    """Keep a conversation only if its task score is at least this (1.0: right answers only)."""
    per_instance: int = 1
    """Keep at most this many conversations per instance (the best rewards first)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_task_score <= 1.0:
            raise ValueError(f"min_task_score must lie in [0, 1], got {self.min_task_score!r}")
        if self.per_instance < 1:
            raise ValueError(f"per_instance must be >= 1, got {self.per_instance!r}")


class RFTBackend(TrainerBackend):
    """``iterations`` sampled stages, each fine-tuned on its accepted conversations."""

    name = "rft"

    def stages(self, config) -> list[Stage]:
        return sft_stages(config, config.iterations)

    def train(self, data: StageData, context: StageContext) -> StageOutcome:
        options = RFTConfig(**context.config.options)
        ranked = sorted(data.episodes, key=lambda e: e.reward.total, reverse=True)
        kept, per_instance = [], {}
        for episode in ranked:
            if (
                episode.task_score >= options.min_task_score
                and per_instance.get(episode.sample_id, 0) < options.per_instance
            ):
                per_instance[episode.sample_id] = per_instance.get(episode.sample_id, 0) + 1
                kept.append(episode)
        outcome = train_sft_stage(dataclasses.replace(data, selected=tuple(kept)), context)
        return StageOutcome(
            result=outcome.result, metrics={**outcome.metrics, "rft/accepted": float(len(kept))}
        )


@hookimpl
def optima_register_trainers() -> list[TrainerSpec]:
    return [
        TrainerSpec(
            name="rft",
            factory=RFTBackend,
            description="Rejection-sampling fine-tuning: SFT on correct samples only (an example plugin).",
            config_class=RFTConfig,
            profiles={"cpu": {"iterations": 1}},
        )
    ]


RECIPES = [
    # On the synthetic chain task the embedded model is rarely right: sample hotter for more
    # distinct candidates per instance, and keep up to two right ones.
    Recipe(
        task="ie/synth-v0",
        trainer="rft",
        values={"generation.temperature": 1.0, "options.per_instance": 2},
    ),
]


@hookimpl
def optima_register_recipes() -> list[Recipe]:
    return RECIPES
