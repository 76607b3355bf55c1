"""ARC-Challenge: a solver and a critic debate grade-school science questions.

============  ==================================================================================
id            ``debate/arc_challenge-v0``
family        debate (spec §2.2)
agents        Alice = solver (speaks first), Bob = critic. ``num_agents=3`` (the paper's v2
              three-agent variant) or more: peers with no fixed roles, each told to solve,
              check the others and answer in ``<A></A>``
each agent    the question followed by "Please choose your answer from [option texts]", no
              private evidence. Alice: terse, token-budget language, a full step-by-step
              derivation, the answer as ``<A>answer</A>``; Bob: find Alice's errors and
              suggest fixes, tersely, never giving the answer
end           the same ``<A>answer</A>`` twice in a row among answer-bearing turns, or
              ``max_turns`` (10), or a turn of 2000+ tokens (spec §2.4)
metric        accuracy: the reference rule (default, ``strict_choice=True``): the stripped,
              lowercased answer equals the gold option text; ``strict_choice=False`` also
              accepts its text up to case, punctuation and spacing, or its label (``B``,
              ``(B)``, ``Answer: B``; ARC's own labels such as ``1``-``4``)
data          ``arc_challenge``: ``train`` (1,119), ``test`` (1,172), ``validation``; gold = the
              option text. Local JSONL in ``$OPTIMA_DATA_DIR/arc_challenge/`` or the hub's
              ``ai2_arc`` (ARC-Challenge)
pool          the 11 formats of :data:`optima_env.prompts.FORMAT_EXAMPLES`, in the solver's
              prompt only (every peer's with three or more agents); ``base_system_prompt`` is
              the prompt without it
============  ==================================================================================

Factory arguments: ``num_agents``, ``strict_choice``, ``tag_answers``, ``style``, ``data_dir``, ``source``,
``limit``, ``hf_name``.

Version history:
    v0: first release.
"""

from __future__ import annotations

from optima_env import Recipe, TaskSpec, hookimpl
from optima_env.families import ChoiceDebateTask

__all__ = ["ARCChallengeTask", "optima_register_recipes", "optima_register_tasks"]

TASK_ID = "debate/arc_challenge-v0"


class ARCChallengeTask(ChoiceDebateTask):
    """ARC-Challenge solver/critic debate (see the module docstring)."""

    dataset = "arc_challenge"


# Recipes of the built-in trainers for this task (spec §5-§7 tables), registered as Recipe
# records below: the reference code's recipes, and as "paper" the paper's Table 8 values where
# they differ (spec §13 item 5). Each states only what differs from the defaults: the fields of
# optima_trainers.config under the trainer's own (tests/optima_trainers/config/test_recipes.py).
_ISFT = {
    "sft.learning_rate": 1e-06,
    "sft.epochs": 4,
    "sft.batch_size": 16,
    "reward.lambda_token": 0.5,
    "reward.lambda_loss": 0.6,
    "selection.theta": 0.6,
    "generation.num_samples": 15,
    "generation.instances": 2000,
    "sft.restart_from_base": True,
}
RECIPES = {
    "code": {
        "isft": {**_ISFT, "iterations": 6},
        "idpo": {
            **_ISFT,
            "dpo.beta": 0.2,
            # iDPO's own weights (Table 8), apart from the iSFT initialization's reward.*
            "tree.lambda_token": 0.4,
            "tree.lambda_loss": 0.7,
            "tree.theta_filter": 0.45,
        },
        "isft-dpo": {
            **_ISFT,
            "generation.num_samples": 10,
            "generation.instances": 10000,
            "tree.theta_filter": 0.45,
        },
    },
    "paper": {"idpo": {"iterations": 5}, "isft-dpo": {"iterations": 3}},
}


@hookimpl
def optima_register_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id=TASK_ID,
            factory=ARCChallengeTask,
            family="debate",
            description="ARC-Challenge solver/critic debate; option text in <A></A>; accuracy.",
        )
    ]


@hookimpl
def optima_register_recipes() -> list[Recipe]:
    return Recipe.table(TASK_ID, RECIPES)
