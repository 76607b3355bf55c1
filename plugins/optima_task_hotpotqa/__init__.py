"""HotpotQA (distractor setting): two agents each hold part of the paragraphs.

============  ==================================================================================
id            ``ie/hotpotqa-v0``
family        information exchange (spec §2.1, §2.3)
agents        Alice, Bob (``num_agents`` up to 6; Alice speaks first, then in turn)
each agent    the question and the information prompt with its private evidence: the supporting
              paragraphs, one entry per supporting *fact* (duplicates kept) in random order,
              dealt in turn; each distractor paragraph to a random agent (1/2 each); every
              paragraph reduced to its first sentence; units joined with newlines
end           the same ``<A>answer</A>`` twice in a row among answer-bearing turns, or
              ``max_turns`` (10), or a turn of 2000+ tokens (spec §2.4)
metric        F1 between the final answer and the gold answer, over the policy tokenizer's tokens
              as the reference code (§2.5; ``f1="squad"``: SQuAD/HotpotQA normalization)
data          ``hotpotqa``: ``train``; ``test`` = the distractor validation set. Local JSONL in
              ``$OPTIMA_DATA_DIR/hotpotqa/`` or the hub's ``hotpot_qa`` (distractor)
pool          the 11 formats of :data:`optima_env.prompts.FORMAT_EXAMPLES`, the same block for
              every agent; ``base_system_prompt`` is the prompt without it
============  ==================================================================================

The dealing reproduces the reference dataloader, quirks included: first sentences only, and a
gold paragraph may reach both agents (or both gold paragraphs one agent). Switches (spec §13
item 11): ``full_paragraphs=True`` deals whole paragraphs; ``strict_split=True`` keeps each
supporting paragraph once, so the two gold paragraphs go to different agents. The dealing draws
from the env's seeded generator: the same seed deals the same hands.

Rows with only paragraph-level support (the IRCoT part of the local dev copy) carry one entry
per supporting title, so their duplicates cannot be reproduced.

Factory arguments: ``num_agents``, ``full_paragraphs``, ``strict_split``, ``f1``, ``f1_tokenizer``,
``tag_answers``, ``data_dir``, ``source``, ``limit``, ``hf_name``.

Version history:
    v0: first release.
"""

from __future__ import annotations

from optima_env import Recipe, TaskSpec, hookimpl
from optima_env.families import SupportingFactsTask

__all__ = ["HotpotQATask", "optima_register_recipes", "optima_register_tasks"]

TASK_ID = "ie/hotpotqa-v0"


class HotpotQATask(SupportingFactsTask):
    """HotpotQA split-context QA (see the module docstring)."""

    dataset = "hotpotqa"
    shuffle_supporting = True
    default_full_paragraphs = False


# Recipes of the built-in trainers for this task (spec §5-§7 tables), registered as Recipe
# records below: the reference code's recipes, and as "paper" the paper's Table 8 values where
# they differ (spec §13 item 5). Each states only what differs from the defaults: the fields of
# optima_trainers.config under the trainer's own (tests/optima_trainers/config/test_recipes.py).
_ISFT = {
    "sft.epochs": 3,
    "generation.num_samples": 10,
    "generation.instances": 10000,
}
RECIPES = {
    "code": {
        "isft": {**_ISFT, "iterations": 6},
        "idpo": {**_ISFT, "iterations": 5, "tree.instances": 13000},
        "isft-dpo": {**_ISFT, "sft.epochs": 2, "iterations": 3, "tree.instances": 12000},
    },
    "paper": {"isft-dpo": {"dpo.beta": 0.5}},
}


@hookimpl
def optima_register_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id=TASK_ID,
            factory=HotpotQATask,
            family="information_exchange",
            description="HotpotQA distractor; paragraphs dealt between agents; F1.",
        )
    ]


@hookimpl
def optima_register_recipes() -> list[Recipe]:
    return Recipe.table(TASK_ID, RECIPES)
