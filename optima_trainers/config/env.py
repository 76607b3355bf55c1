"""The env settings of a run's rollouts: :class:`EnvSettings`, one typed value.

A stage's rollouts (:mod:`optima_trainers.generation`) and the tree search
(:func:`optima_trainers.tree.search.build_trees`) build their
:class:`~optima_env.conversation_env.ConversationEnv` from it. What the run's
:class:`~optima_trainers.config.sections.GenerationConfig` decides (``max_turns``,
``termination``, ``message_format``) is not a field, nor is the split (``TrainConfig.split``):
:meth:`EnvSettings.kwargs` takes them from there, so the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from optima_env.errors import TaskContractError
from optima_trainers.config.sections import GenerationConfig

__all__ = ["EnvSettings"]

FROM_GENERATION = ("max_turns", "termination", "message_format")
"""The env options a :class:`GenerationConfig` decides."""

ARGUMENTS = ("split",)
"""The env options :meth:`EnvSettings.kwargs` takes as arguments."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvSettings:
    """The :class:`~optima_env.conversation_env.ConversationEnv` options of a run's rollouts,
    besides those of its :class:`GenerationConfig` (defaults: the env's own)."""

    diverse_formats: bool = False
    """Draw one format instruction from the task's prompt pool per episode (the initialization)."""
    max_prompt_tokens: int | None = None
    """The longest prompt a turn may start from (``None``: no budget)."""
    tokenizer: Any = None
    """Counts the turns' tokens (``None``: the env's whitespace count)."""
    scoring: bool = True
    """The env computes each episode's reward (a run scores with its own scorer instead)."""
    pm: Any = None
    """The plugin manager whose hooks the env calls."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further ConversationEnv options (``turn_token_cap``, ...)."""

    def __post_init__(self) -> None:
        typed = {f.name for f in fields(self)} - {"extra"}
        clash = sorted(set(self.extra) & (typed | set(FROM_GENERATION) | set(ARGUMENTS)))
        if clash:
            where = {n: f"generation.{n}" if n in FROM_GENERATION else n for n in clash}
            raise TaskContractError(
                f"EnvSettings.extra: expected further ConversationEnv options, got {clash}; set "
                f"{', '.join(where.values())} instead"
            )

    def kwargs(self, generation: GenerationConfig, *, split: str = "train") -> dict[str, Any]:
        """The ConversationEnv keyword arguments: these settings with ``generation``'s, for the
        instances of ``split``."""
        return {
            **self.extra,
            "split": split,
            "max_turns": generation.max_turns,
            "max_prompt_tokens": self.max_prompt_tokens,
            "tokenizer": self.tokenizer,
            "diverse_formats": self.diverse_formats,
            "message_format": generation.message_format,
            "termination": generation.termination,
            "scoring": self.scoring,
            "pm": self.pm,
        }
