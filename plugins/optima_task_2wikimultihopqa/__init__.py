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
data          ``2wikimultihopqa``: the original release, ``train.json`` / ``dev.json`` (``test``
              = dev) in ``$OPTIMA_DATA_DIR/2wikimultihopqa/`` or ``hf_name=<path>``; there is
              no hub copy. A question-only copy raises a clear error (``require_context=False``
              plays it closed-book, with empty information)
pool          the 11 formats of :data:`optima_env.prompts.FORMAT_EXAMPLES`, the same block for
              every agent; ``base_system_prompt`` is the prompt without it
============  ==================================================================================

As in the reference dataloader, a paragraph supporting two facts is listed twice and can reach
both agents. Switches: ``strict_split=True`` keeps each supporting paragraph once (spec §13 item
11); ``full_paragraphs=False`` gives first sentences only.

Factory arguments: ``num_agents``, ``full_paragraphs``, ``strict_split``, ``require_context``,
``f1``, ``f1_tokenizer``, ``tag_answers``, ``data_dir``, ``source``, ``limit``, ``hf_name``.

Version history:
    v0: first release.
"""

from __future__ import annotations

from typing import Any

from optima_env import TaskSpec, hookimpl
from optima_env.families import SupportingFactsTask

__all__ = ["TwoWikiMultihopQATask", "optima_register_tasks"]

TASK_ID = "ie/2wikimultihopqa-v0"


class TwoWikiMultihopQATask(SupportingFactsTask):
    """2WikiMultihopQA split-context QA (see the module docstring)."""

    dataset = "2wikimultihopqa"
    shuffle_supporting = False
    default_full_paragraphs = True

    def __init__(self, *, require_context: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.require_context = bool(require_context)

    def load_options(self) -> dict[str, Any]:
        return {"require_context": self.require_context}


# Trainer presets (spec §5-§7 tables): the reference code's recipes, and as "paper" the
# paper's Table 8 values where they differ (spec §13 item 5).
_ISFT = {
    "sft.learning_rate": 2e-05,
    "sft.epochs": 2,
    "sft.batch_size": 32,
    "reward.lambda_token": 0.6,
    "reward.lambda_loss": 1.0,
    "selection.theta": 0.5,
    "generation.num_samples": 10,
    "generation.instances": 10000,
    "iterations": 6,
}
PRESETS = {
    "code": {
        "isft": _ISFT,
        "idpo": {
            **_ISFT,
            "iterations": 5,
            "dpo.beta": 0.5,
            "tree.reward.lambda_token": 0.6,
            "tree.reward.lambda_loss": 1.0,
            "tree.theta_filter": 0.4,
            "tree.theta_diff": 0.2,
            "tree.instances": 12000,
        },
        "isft-dpo": {
            **_ISFT,
            "sft.epochs": 1,
            "iterations": 3,
            "dpo.beta": 0.5,
            "tree.reward.lambda_token": 0.6,
            "tree.reward.lambda_loss": 1.0,
            "tree.theta_filter": 0.4,
            "tree.theta_diff": 0.2,
            "tree.instances": 12000,
        },
    },
    "paper": {},
}


@hookimpl
def optima_register_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id=TASK_ID,
            presets=PRESETS,
            factory=TwoWikiMultihopQATask,
            family="information_exchange",
            description="2WikiMultihopQA; paragraphs dealt between agents; F1 over aliases.",
        )
    ]
