"""The conversation rules that code outside the env applies too (spec §2.4, §13 item 12).

The env (:class:`~optima_env.conversation_env.ConversationEnv`) and the trainers' tree search
(which replays conversations without an env per rollout) must end and score a conversation the same
way, so both take these from here:

* :class:`AnswerTracker` keeps the running *current answer* of a conversation and applies one of two
  agreement rules (:data:`TERMINATIONS`, checked by :func:`check_termination`) to every
  answer-bearing turn:

  * ``repeat`` (the reference code, default): the episode terminates when a turn's answer equals
    the current answer exactly, i.e. the same answer string twice in a row among answer-bearing
    turns (possibly one agent twice);
  * ``all_agents`` (the paper: "both agents mark the same answer"): it terminates once every agent
    has given an answer and their latest answers are all the same string.

  Either way the answer becomes the current answer, which is the episode's final answer.
* :func:`checked_score`: the task's score of a final answer, checked to lie in [0, 1].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from optima_env.errors import TaskContractError

if TYPE_CHECKING:
    from optima_env.task import Task
    from optima_env.types import TaskSample

__all__ = ["TERMINATIONS", "AnswerTracker", "check_termination", "checked_score"]

TERMINATIONS = ("repeat", "all_agents")


def check_termination(rule: object) -> str:
    """``rule`` if it is one of :data:`TERMINATIONS`, else :class:`TaskContractError`."""
    if rule not in TERMINATIONS:
        raise TaskContractError(
            f"termination must be one of {TERMINATIONS} ('repeat': the same answer twice in a row, "
            f"the reference code; 'all_agents': every agent's latest answer the same), got {rule!r}"
        )
    return str(rule)


class AnswerTracker:
    """The current answer and the agreement rule of one conversation.

    >>> tracker = AnswerTracker("all_agents", ("Alice", "Bob"))
    >>> tracker.update("Alice", "x"), tracker.update("Alice", "x"), tracker.update("Bob", "x")
    (False, False, True)
    >>> AnswerTracker("repeat", ("Alice", "Bob")).update("Alice", None)
    False
    """

    __slots__ = ("agents", "current", "latest", "rule")

    def __init__(self, rule: str, agents: Sequence[str]) -> None:
        self.rule = check_termination(rule)
        self.agents = tuple(agents)
        self.current: str | None = None
        self.latest: dict[str, str] = {}

    def update(self, agent: str, answer: str | None) -> bool:
        """Record ``agent``'s turn answer (``None``: no answer); True when the episode ends here."""
        if answer is None:
            return False
        if self.rule == "repeat":
            agreed = answer == self.current
        else:
            self.latest[agent] = answer
            agreed = len(self.latest) == len(self.agents) and len(set(self.latest.values())) == 1
        self.current = answer
        return agreed


def checked_score(task: Task, answer: str | None, sample: TaskSample, *, tokenizer: Any = None) -> float:
    """The task's score of ``answer`` (with the policy's ``tokenizer`` when the task takes one,
    :func:`~optima_env.families.scoring.score_with_tokenizer`), which must lie in [0, 1]."""
    from optima_env.families.scoring import score_with_tokenizer

    score = score_with_tokenizer(task, answer, sample, tokenizer)
    if not 0.0 <= score <= 1.0:
        raise TaskContractError(f"task {task.id!r} scored {score!r}; scores must lie in [0, 1]")
    return score
