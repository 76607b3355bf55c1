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
metric        F1 against the answer, best over all its aliases (SQuAD normalization by default;
              ``f1_tokenizer=<tokenizer>`` gives the reference code's token F1)
data          ``triviaqa``: ``train``; ``test`` = validation. Local JSONL in the hub schema in
              ``$OPTIMA_DATA_DIR/triviaqa/`` or the hub's ``trivia_qa``; a question-only copy
              raises a clear error (``require_context=False`` plays it closed-book)
pool          the 11 formats of :data:`optima_env.prompts.FORMAT_EXAMPLES`, the same block for
              every agent; ``base_system_prompt`` is the prompt without it
============  ==================================================================================

Factory arguments: ``num_agents``, ``require_context``, ``f1_tokenizer``, ``data_dir``,
``source``, ``limit``, ``hf_name``.

Version history:
    v0: first release.
"""

from __future__ import annotations

from typing import Any

from optima_env import TaskSpec, hookimpl
from optima_env.families import ShuffledSnippetsTask

__all__ = ["TriviaQATask", "optima_register_tasks"]

TASK_ID = "ie/triviaqa-v0"


class TriviaQATask(ShuffledSnippetsTask):
    """TriviaQA with snippets split between agents (see the module docstring)."""

    dataset = "triviaqa"

    def __init__(self, *, require_context: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.require_context = bool(require_context)

    def load_options(self) -> dict[str, Any]:
        return {"require_context": self.require_context}


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
