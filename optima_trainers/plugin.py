"""The built-in trainers and data selection, registered through the same hooks a third party uses.

Found through the ``optima`` entry-point group (``trainers = "optima_trainers.plugin"`` in
pyproject.toml). ``optima_register_trainers`` returns one :class:`~optima_env.registry.TrainerSpec`
per variant; each factory builds an :class:`~optima_trainers.loop.IterativeTrainer`.
``optima_select_training_data`` is registered ``trylast``: any plugin returning a list first
replaces the built-in iSFT selection, one returning ``None`` defers to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from optima_env.errors import TaskContractError
from optima_env.hookspecs import hookimpl
from optima_env.registry import TrainerSpec
from optima_env.types import Episode

__all__ = ["make_factory", "optima_register_trainers", "optima_select_training_data"]

_DESCRIPTIONS = {
    "isft": "Iterative SFT: best of N per instance, top 70% above θ, SFT on own turns (spec §5).",
    "idpo": "Iterative DPO: MCTS turn trees, best-vs-worst sibling pairs, RPO loss (spec §6).",
    "isft-dpo": "Hybrid: per cycle one iSFT stage, then one plain-DPO stage (spec §7).",
}


def make_factory(name: str):
    """The factory of one built-in trainer: ``factory(config, *, run_dir, pm=None, progress=True)``."""

    def factory(config: Any, **kwargs: Any) -> Any:
        from optima_trainers.loop import IterativeTrainer

        if config.trainer != name:
            raise TaskContractError(f"the {name!r} trainer got a config for {config.trainer!r}")
        return IterativeTrainer(config, **kwargs)

    factory.__name__ = f"{name.replace('-', '_')}_factory"
    return factory


@hookimpl
def optima_register_trainers() -> list[TrainerSpec]:
    return [TrainerSpec(name=n, factory=make_factory(n), description=d) for n, d in _DESCRIPTIONS.items()]


@hookimpl(trylast=True)
def optima_select_training_data(
    episodes: Sequence[Episode], trainer: str, config: Mapping[str, Any]
) -> list[Episode] | None:
    from optima_trainers.selection import SelectionConfig, select_isft

    return select_isft(episodes, SelectionConfig.from_mapping(config))
