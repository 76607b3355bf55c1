"""2WikiMultihopQA: two agents each hold part of the paragraphs.

============  ==================================================================================
id            ``ie/2wikimultihopqa-v0``
family        information exchange (spec §2.1, §2.3)
agents        Alice, Bob (``num_agents`` up to 6; Alice speaks first, then in turn)
each agent    the question and the information prompt with its private evidence: the supporting
              paragraphs, one entry per supporting fact in listed order, dealt in turn (even
              entries to Alice, odd to Bob); each distractor paragraph to a random agent (1/2
              each); whole paragraphs; units joined with newlines
end           the same ``<A>answer</A>`` twice in a row among answer-bearing turns, or
              ``max_turns`` (10), or a turn of 2000+ tokens (spec §2.4)
metric        F1 against the gold answer, best over its aliases, over the policy tokenizer's
              tokens as the reference code (``f1="squad"``: SQuAD normalization)
data          ``2wikimultihopqa``: ``test`` = ``dev`` = the first of ``dev.json`` (the original
              release), ``dev.jsonl``, the local copy with contexts (below), ``dev_qa_only.jsonl``
              found in ``$OPTIMA_DATA_DIR/2wikimultihopqa/``; ``train`` = ``train.json`` (none
              here: see below); or ``hf_name=<file or folder>``; there is no hub copy. A
              question-only copy raises a clear error (``require_context=False`` plays it
              closed-book, with empty information)
pool          the 11 formats of :data:`optima_env.prompts.FORMAT_EXAMPLES`, the same block for
              every agent; ``base_system_prompt`` is the prompt without it
============  ==================================================================================

As in the reference dataloader, a paragraph supporting two facts is listed twice and can reach
both agents. Switches: ``strict_split=True`` keeps each supporting paragraph once (spec §13 item
11); ``full_paragraphs=False`` gives first sentences only.

The local dev copy (``$OPTIMA_DATA_DIR/2wikimultihopqa/``, provenance in its ``SOURCE.md``) is two
files read as one split, in this order: ``dev_200_context.jsonl``, the first 200 official dev
questions (``dev_0`` ... ``dev_199``) with the official sentence-level supporting facts, then
``dev_ircot_paragraphs.jsonl``, IRCoT's 600 dev questions with paragraph-level support only. The
9 questions in both are kept once, as the sentence-level row (its answer aliases included); the
loader's report counts the 9 left out, so the split has 791 instances. Every instance's
``metadata["sf_granularity"]`` says which kind it is (``sentence`` or ``paragraph``). Scores are
the best over the answer and its aliases: the 200 rows list Wikidata aliases in no canonical
order (``dev_88``: "City of Madrid", "Madrid, Spain", "Madrid"), IRCoT's rows the official
answer alone.

How the dealing differs on the paragraph-level rows (the same code deals both; only the input
differs):

* one entry per supporting *paragraph* (no duplicates), so a paragraph never reaches two agents:
  ``strict_split`` changes nothing there;
* the entries come in the file's context order (IRCoT's shuffled paragraph order), not the
  official facts' order, which follows the reasoning chain. With two gold paragraphs each agent
  still gets one, but which one is a coin flip of the data; with four (comparison questions:
  two entities and one fact page each) the official order pairs each entity with its own fact
  page in one hand (``dev_19``: Alice the first film and its director), while the context order
  can pair them differently (IRCoT's ``dev_19`` deals Alice both directors' pages);
* a paragraph is one "sentence" (the source keeps no sentence boundaries), so
  ``full_paragraphs=False`` keeps the whole paragraph there.

No train split exists locally. Asking for ``train`` (every trainer does) raises a ``DataError``
saying how to provide it: take ``train.json`` from the original release
(github.com/Alab-NII/2wikimultihop, linked from its README) and put it in
``$OPTIMA_DATA_DIR/2wikimultihopqa/``, or pass ``hf_name=<a folder holding train.json and
dev.json>`` (trainers: ``--set 'task_kwargs={"hf_name": "/path/to/folder"}'``). A file given as
``hf_name`` is read for every split, evaluation included, so give a folder.

Factory arguments: ``num_agents``, ``full_paragraphs``, ``strict_split``, ``require_context``,
``f1``, ``f1_tokenizer``, ``tag_answers``, ``data_dir``, ``source``, ``limit``, ``hf_name``.

Version history:
    v0: first release; the local dev copy with contexts (791 instances) is read as ``test``.
"""

from __future__ import annotations

from optima_env import Recipe, TaskSpec, hookimpl
from optima_env.families import SupportingFactsTask

__all__ = ["TwoWikiMultihopQATask", "optima_register_recipes", "optima_register_tasks"]

TASK_ID = "ie/2wikimultihopqa-v0"


class TwoWikiMultihopQATask(SupportingFactsTask):
    """2WikiMultihopQA split-context QA (see the module docstring)."""

    dataset = "2wikimultihopqa"
    shuffle_supporting = False
    default_full_paragraphs = True


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
        "idpo": {**_ISFT, "iterations": 5, "dpo.beta": 0.5, "tree.instances": 12000},
        "isft-dpo": {**_SHARED, "iterations": 3, "dpo.beta": 0.5, "tree.instances": 12000},
    },
    "paper": {},
}


@hookimpl
def optima_register_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id=TASK_ID,
            factory=TwoWikiMultihopQATask,
            family="information_exchange",
            description="2WikiMultihopQA; paragraphs dealt between agents; F1 over aliases.",
        )
    ]


@hookimpl
def optima_register_recipes() -> list[Recipe]:
    return Recipe.table(TASK_ID, RECIPES)
