"""The built-in trainers and data selection, registered through the same hooks a third party uses.

Found through the ``optima`` entry-point group (``trainers = "optima_trainers.backends.builtin"`` in
pyproject.toml). ``optima_register_trainers`` returns one :class:`~optima_env.specs.TrainerSpec`
per built-in backend (:mod:`optima_trainers.backends.contract`), with the values each one needs
(``defaults``) and its iteration count on the ``cpu`` profile. ``optima_select_training_data`` is
registered ``trylast``: any plugin returning a list first replaces the built-in iSFT selection,
one returning ``None`` defers to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from optima_env.hookspecs import hookimpl
from optima_env.specs import TrainerSpec
from optima_env.types import Episode

__all__ = ["optima_register_trainers", "optima_select_training_data"]


def _factory(name: str) -> Any:
    def factory(config: Any) -> Any:
        from optima_trainers.backends import contract as backends

        cls = {
            "isft": backends.ISFTBackend,
            "idpo": backends.IDPOBackend,
            "isft-dpo": backends.ISFTDPOBackend,
        }
        return cls[name](config)

    factory.__name__ = f"{name.replace('-', '_')}_backend"
    return factory


def _grpo_backend(config: Any) -> Any:
    from optima_trainers.backends.grpo import GRPOBackend

    return GRPOBackend(config)


def _grpo_options() -> type:
    from optima_trainers.backends.grpo import GRPOOptions  # no torch at import: TRL is imported when training

    return GRPOOptions


@hookimpl
def optima_register_trainers() -> list[TrainerSpec]:
    return [
        TrainerSpec(
            name="isft",
            factory=_factory("isft"),
            description="Iterative SFT: best of N per instance, top 70% above θ, SFT on own turns (spec §5).",
            profiles={"cpu": {"iterations": 2}},
        ),
        TrainerSpec(
            name="idpo",
            factory=_factory("idpo"),
            description="Iterative DPO: MCTS turn trees, best-vs-worst sibling pairs, RPO loss (spec §6).",
            defaults={"dpo.rpo_alpha": 1.0, "tree.normalizer_percentile": 85.0},
            profiles={"cpu": {"iterations": 1}},
        ),
        TrainerSpec(
            name="grpo",
            factory=_grpo_backend,
            description="GRPO (TRL's GRPOTrainer) on the Optima reward, both agents' turns trained online.",
            config_class=_grpo_options(),
            profiles={"cpu": {"iterations": 1}},
        ),
        TrainerSpec(
            name="isft-dpo",
            factory=_factory("isft-dpo"),
            description="Hybrid: per cycle one iSFT stage, then one plain-DPO tree stage (spec §7).",
            defaults={"dpo.rpo_alpha": None, "tree.normalizer_percentile": 80.0},
            profiles={"cpu": {"iterations": 1}},
        ),
    ]


@hookimpl(trylast=True)
def optima_select_training_data(
    episodes: Sequence[Episode], trainer: str, config: Mapping[str, Any]
) -> list[Episode] | None:
    from optima_trainers.sft.selection import select_training_data

    return select_training_data(episodes, config)
