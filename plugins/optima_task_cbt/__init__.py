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
metric        F1 against the gold word (SQuAD normalization by default;
              ``f1_tokenizer=<tokenizer>`` gives the reference code's token F1)
data          ``cbt``: ``train``, ``test``. Local JSONL in the hub schema in
              ``$OPTIMA_DATA_DIR/cbt/`` or the hub's ``cbt`` (config CN)
pool          the 11 formats of :data:`optima_env.prompts.FORMAT_EXAMPLES`, the same block for
              every agent; ``base_system_prompt`` is the prompt without it
============  ==================================================================================

The dealing is deterministic (no randomness), as in the reference dataloader.

Factory arguments: ``num_agents``, ``f1_tokenizer``, ``data_dir``, ``source``, ``limit``,
``hf_name``.

Version history:
    v0: first release.
"""

from __future__ import annotations

from optima_env import TaskSpec, hookimpl
from optima_env.families import HalvesTask

__all__ = ["CBTTask", "optima_register_tasks"]

TASK_ID = "ie/cbt-v0"


class CBTTask(HalvesTask):
    """CBT-CN with the story split between agents (see the module docstring)."""

    dataset = "cbt"


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
