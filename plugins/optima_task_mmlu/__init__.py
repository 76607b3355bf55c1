"""MMLU: a solver and a critic debate multiple-choice questions.

============  ==================================================================================
id            ``debate/mmlu-v0``
family        debate (spec §2.2)
agents        Alice = solver (speaks first), Bob = critic. ``num_agents=3`` or more: peers with
              no fixed roles (:data:`optima_env.prompts.PEER_DEBATE_PROMPT`)
each agent    the question followed by "Select an answer from the options [option texts] to
              fill in the _." (the reference wording), no private evidence. Alice: terse,
              token-budget language, a full step-by-step derivation, the answer as
              ``<A>answer</A>``; Bob: find Alice's errors, never giving the answer
end           the same ``<A>answer</A>`` twice in a row among answer-bearing turns, or
              ``max_turns`` (10), or a turn of 2000+ tokens (spec §2.4)
metric        accuracy: the reference rule (default, ``strict_choice=True``): the stripped,
              lowercased answer equals the gold option text; ``strict_choice=False`` also
              accepts differences of case, punctuation and spacing, or its letter A-D
data          ``mmlu``: ``train`` = ``auxiliary_train`` minus the questions also in
              ARC-Challenge train, shuffled with seed 42 (spec §2.2; the dropped count is
              logged; ``filter_arc=False`` skips the filter); ``test`` (14,042). Local JSONL in
              ``$OPTIMA_DATA_DIR/mmlu/`` or the hub's ``cais/mmlu``
pool          the 11 formats of :data:`optima_env.prompts.FORMAT_EXAMPLES`, in the solver's
              prompt only; ``base_system_prompt`` is the prompt without it
============  ==================================================================================

Factory arguments: ``num_agents``, ``strict_choice``, ``tag_answers``, ``style``, ``filter_arc``,
``data_dir``, ``source``, ``limit``, ``hf_name``.

Version history:
    v0: first release.
"""

from __future__ import annotations

from typing import Any

from optima_env import Recipe, TaskSpec, hookimpl
from optima_env.families import ChoiceDebateTask

__all__ = ["MMLUTask", "optima_register_recipes", "optima_register_tasks"]

TASK_ID = "debate/mmlu-v0"


class MMLUTask(ChoiceDebateTask):
    """MMLU solver/critic debate (see the module docstring)."""

    dataset = "mmlu"
    options_phrase = "Select an answer from the options {options} to fill in the _."

    def __init__(self, *, filter_arc: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.filter_arc = bool(filter_arc)

    def load_options(self) -> dict[str, Any]:
        return {"filter_arc": self.filter_arc}


# Recipes of the built-in trainers for this task (spec §5-§7 tables), registered as Recipe
# records below: the reference code's recipes, and as "paper" the paper's Table 8 values where
# they differ (spec §13 item 5). Each states only what differs from the defaults: the fields of
# optima_trainers.config under the trainer's own (tests/optima_trainers/config/test_recipes.py).
_ISFT = {
    "sft.learning_rate": 1e-06,
    "sft.epochs": 2,
    "sft.batch_size": 16,
    "reward.lambda_loss": 0.7,
    "selection.theta": 0.6,
    "generation.num_samples": 10,
    "generation.instances": 10000,
    "sft.restart_from_base": True,
}
RECIPES = {
    "code": {
        "isft": {**_ISFT, "iterations": 6},
        "idpo": {**_ISFT, "iterations": 5},
        "isft-dpo": {**_ISFT, "selection.theta": 0.7, "iterations": 3, "tree.theta_filter": 0.45},
    },
    "paper": {"isft-dpo": {"selection.theta": 0.6, "tree.theta_filter": 0.4}},
}


@hookimpl
def optima_register_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id=TASK_ID,
            factory=MMLUTask,
            family="debate",
            description="MMLU solver/critic debate; option text in <A></A>; accuracy.",
        )
    ]


@hookimpl
def optima_register_recipes() -> list[Recipe]:
    return Recipe.table(TASK_ID, RECIPES)
