"""TriviaQA (rc): two agents each hold part of the web search snippets.

============  ==================================================================================
id            ``ie/triviaqa-v0``
family        information exchange (spec §2.1, §2.3)
agents        Alice, Bob (``num_agents`` up to 6; Alice speaks first, then in turn)
each agent    the question and the information prompt with its private evidence: the search
              result snippets (``search_results.description``), shuffled and dealt in turn;
              joined with newlines
end           the same ``<A>answer</A>`` twice in a row among answer-bearing turns, or
              ``max_turns`` (10), or a turn of 2000+ tokens (spec §2.4)
metric        F1 against the answer, best over all its aliases, over the policy tokenizer's
              tokens as the reference code (``f1="squad"``: SQuAD normalization)
data          ``triviaqa``: ``train``; ``test`` = validation. Local JSONL in the hub schema in
              ``$OPTIMA_DATA_DIR/triviaqa/`` or the hub's ``trivia_qa``; a question-only copy
              raises a clear error (``require_context=False`` plays it closed-book)
pool          the 11 formats of :data:`optima_env.prompts.FORMAT_EXAMPLES`, the same block for
              every agent; ``base_system_prompt`` is the prompt without it
============  ==================================================================================

Factory arguments: ``num_agents``, ``require_context``, ``f1``, ``f1_tokenizer``, ``tag_answers``,
``data_dir``, ``source``, ``limit``, ``hf_name``.

Version history:
    v0: first release.
"""

from __future__ import annotations

from optima_env import Recipe, TaskSpec, hookimpl
from optima_env.families import ShuffledSnippetsTask

__all__ = ["TriviaQATask", "optima_register_recipes", "optima_register_tasks"]

TASK_ID = "ie/triviaqa-v0"


class TriviaQATask(ShuffledSnippetsTask):
    """TriviaQA with snippets split between agents (see the module docstring)."""

    dataset = "triviaqa"


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
_ISFT = {**_SHARED, "sft.epochs": 3}
RECIPES = {
    "code": {
        "isft": {**_ISFT, "iterations": 6},
        "idpo": {**_ISFT, "iterations": 5, "dpo.beta": 0.5},
        "isft-dpo": {
            **_SHARED,
            "selection.theta": 0.6,
            "iterations": 3,
            "dpo.beta": 0.7,
            "tree.theta_filter": 0.43,
            "tree.instances": 12000,
        },
    },
    "paper": {"isft": {"selection.theta": 0.6}, "isft-dpo": {"tree.theta_filter": 0.4}},
}


@hookimpl
def optima_register_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id=TASK_ID,
            factory=TriviaQATask,
            family="information_exchange",
            description="TriviaQA rc; search snippets dealt between agents; F1 over aliases.",
        )
    ]


@hookimpl
def optima_register_recipes() -> list[Recipe]:
    return Recipe.table(TASK_ID, RECIPES)
