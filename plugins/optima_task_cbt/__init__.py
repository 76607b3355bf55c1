"""Children's Book Test (CN): each agent holds half of the story.

============  ==================================================================================
id            ``ie/cbt-v0``
family        information exchange (spec §2.1, §2.3)
agents        Alice, Bob (``num_agents`` up to 6; Alice speaks first, then in turn)
each agent    the question (the 21st sentence, blank written ``XXXXX``) followed by "Please
              choose your answer from [options]", and its private evidence: Alice the first
              half of the 20 story sentences, Bob the second half (with more agents,
              contiguous parts in order); joined with newlines
end           the same ``<A>answer</A>`` twice in a row among answer-bearing turns, or
              ``max_turns`` (10), or a turn of 2000+ tokens (spec §2.4)
metric        F1 against the gold word, over the policy tokenizer's tokens as the reference
              code (``f1="squad"``: SQuAD normalization)
data          ``cbt``: ``train``, ``test``. Local JSONL in the hub schema in
              ``$OPTIMA_DATA_DIR/cbt/`` or the hub's ``cbt`` (config CN)
pool          the 11 formats of :data:`optima_env.prompts.FORMAT_EXAMPLES`, the same block for
              every agent; ``base_system_prompt`` is the prompt without it
============  ==================================================================================

The dealing is deterministic (no randomness), as in the reference dataloader.

Factory arguments: ``num_agents``, ``f1``, ``f1_tokenizer``, ``tag_answers``, ``data_dir``,
``source``, ``limit``, ``hf_name``.

Version history:
    v0: first release.
"""

from __future__ import annotations

from optima_env import Recipe, TaskSpec, hookimpl
from optima_env.families import HalvesTask

__all__ = ["CBTTask", "optima_register_recipes", "optima_register_tasks"]

TASK_ID = "ie/cbt-v0"


class CBTTask(HalvesTask):
    """CBT-CN with the story split between agents (see the module docstring)."""

    dataset = "cbt"


# Recipes of the built-in trainers for this task (spec §5-§7 tables), registered as Recipe
# records below: the reference code's recipes, and as "paper" the paper's Table 8 values where
# they differ (spec §13 item 5). Each states only what differs from the defaults: the fields of
# optima_trainers.config under the trainer's own (tests/optima_trainers/config/test_recipes.py).
# _SHARED: what all three recipes set; _ISFT adds the iSFT initialization's own
# SFT epochs (isft-dpo keeps the default).
_SHARED = {
    "generation.num_samples": 10,
    "generation.instances": 10000,
}
_ISFT = {**_SHARED, "sft.epochs": 2}
RECIPES = {
    "code": {
        "isft": {**_ISFT, "iterations": 6},
        "idpo": {**_ISFT, "iterations": 5, "tree.instances": 13000},
        "isft-dpo": {**_SHARED, "iterations": 3, "dpo.beta": 0.7, "tree.instances": 12000},
    },
    "paper": {},
}


@hookimpl
def optima_register_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id=TASK_ID,
            factory=CBTTask,
            family="information_exchange",
            description="Children's Book Test CN; the story split between agents; F1.",
        )
    ]


@hookimpl
def optima_register_recipes() -> list[Recipe]:
    return Recipe.table(TASK_ID, RECIPES)
