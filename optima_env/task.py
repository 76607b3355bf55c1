"""The task contract: what a plugin implements to become an optima environment.

A task knows its data, what each agent is told, how to read an answer out of a turn and how to
score it. It knows nothing about tokens, rewards or training: those belong to the env, reward and
trainer layers. :class:`~optima_env.conversation_env.ConversationEnv` turns any task into a
PettingZoo environment.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Mapping, Sequence
from typing import ClassVar

from optima_env.errors import TaskContractError
from optima_env.types import AgentView, TaskSample

__all__ = [
    "DEFAULT_AGENTS",
    "FAMILY_METRICS",
    "Task",
    "agent_names",
    "declared_metric",
    "evidence",
    "metric_name",
    "needs_evidence",
    "require_evidence",
]

DEFAULT_AGENTS: tuple[str, ...] = ("Alice", "Bob", "Charlie", "Dave", "Eve", "Frank")
FAMILY_METRICS: Mapping[str, str] = {"information_exchange": "F1", "debate": "accuracy"}
"""The metric of a task that does not set :attr:`Task.metric`, by family."""


def metric_name(task: Task | None, family: str = "") -> str:
    """The name reports give a task's score: its ``metric``, else its family's, else ``"score"``.

    >>> metric_name(None, "debate")
    'accuracy'
    """
    return declared_metric(task) or FAMILY_METRICS.get(getattr(task, "family", None) or family, "score")


def declared_metric(task: object) -> str | None:
    """The ``metric`` a task declares itself (stripped), or None."""
    declared = getattr(task, "metric", None)
    return declared.strip() if isinstance(declared, str) and declared.strip() else None


def needs_evidence(task: Task | None, family: str = "") -> bool:
    """Whether ``task`` deals private evidence to its agents: an information-exchange task does
    (its agents must pool what they hold), a debate task does not.

    A task that deals none on purpose (closed-book) sets ``deals_evidence = False``.

    >>> needs_evidence(None, "information_exchange"), needs_evidence(None, "debate")
    (True, False)
    """
    declared = getattr(task, "deals_evidence", None)
    if isinstance(declared, bool):
        return declared
    return (getattr(task, "family", None) or family) == "information_exchange"


def evidence(views: Mapping[str, AgentView]) -> tuple[str, ...]:
    """The task's evidence for one instance: every agent's :attr:`AgentView.private`, in speaking
    order, each unit once. ``AgentView.private`` is the one declaration of what an agent holds: the
    env records it, the single-agent baselines (CoT, SC) are shown all of it, MAD and AutoForm deal
    it to the same agents, and :func:`optima_env.testing.check_task` fails an information-exchange
    task whose views declare none.

    >>> a = AgentView(agent="Alice", system_prompt="p", base_system_prompt="p", private=("x", "y"))
    >>> b = AgentView(agent="Bob", system_prompt="p", base_system_prompt="p", private=("y", "z"))
    >>> evidence({"Alice": a, "Bob": b})
    ('x', 'y', 'z')
    """
    units: list[str] = []
    for view in views.values():
        units.extend(u for u in view.private if u not in units)
    return tuple(units)


def require_evidence(task: Task, samples: Sequence[TaskSample], *, seed: int = 0) -> None:
    """Raise :class:`TaskContractError` when ``task`` needs evidence (:func:`needs_evidence`) but
    its views declare none for any of ``samples`` (dealt with ``random.Random(seed + i)``): its
    baselines would see only the question and score meaninglessly. One instance without evidence
    is fine (a TriviaQA question without search results); a task that never declares any is not."""
    if not needs_evidence(task) or not samples:
        return
    for i, sample in enumerate(samples):
        if evidence(task.views(sample, rng=random.Random(seed + i), format_index=None)):
            return
    raise TaskContractError(
        f"task {task.id!r} (information exchange) declares no evidence: every AgentView.private "
        f"of its first {len(samples)} instance(s) is empty, so its baselines would see only the "
        "question; list each agent's facts as AgentView(..., private=(fact, ...)) in views()"
    )


def agent_names(num_agents: int) -> tuple[str, ...]:
    """The first ``num_agents`` default agent names (Alice first).

    >>> agent_names(3)
    ('Alice', 'Bob', 'Charlie')
    """
    if not isinstance(num_agents, int) or not 2 <= num_agents <= len(DEFAULT_AGENTS):
        raise TaskContractError(
            f"num_agents must be an int from 2 to {len(DEFAULT_AGENTS)}, got {num_agents!r}"
        )
    return DEFAULT_AGENTS[:num_agents]


class Task(abc.ABC):
    """Base class of every task. Subclasses set ``agents`` and implement the abstract methods."""

    family: ClassVar[str] = "information_exchange"
    agents: tuple[str, ...] = ("Alice", "Bob")
    """Speaking order: the first agent speaks first, then strict rotation."""
    enforce_name_prefix: bool = True
    """Every turn starts with ``"Name:"``; the env adds the prefix when a reply lacks it."""
    num_formats: int = 0
    """Size of the format-diverse prompt pool (spec §4); 0 when the task has none."""
    deals_evidence: bool | None = None
    """Whether the views deal private evidence (``AgentView.private``); ``None``: information
    exchange does, debate does not (:func:`needs_evidence`). ``False`` for a closed-book variant,
    whose baselines then rightly see only the question."""
    metric: ClassVar[str | None] = None
    """What :meth:`score` measures, as reports name it (``"F1"``, ``"accuracy"``, ``"exact match"``);
    ``None``: the family's usual metric (see :func:`metric_name`)."""

    _id: str | None = None

    @property
    def id(self) -> str:
        """The registered id (set by ``make``/``make_task``), or the class name if unregistered."""
        return self._id or type(self).__name__

    def bind(self, task_id: str) -> None:
        """Record the id the task was registered under (called by the registry)."""
        self._id = task_id

    @abc.abstractmethod
    def samples(self, split: str) -> Sequence[TaskSample]:
        """The instances of ``split`` (``train`` or ``test`` at least), in a fixed order."""

    @abc.abstractmethod
    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        """What each agent is told for ``sample``. An information-exchange task declares the
        evidence it deals in each view's ``private`` (also shown in that agent's prompt): it is
        what the baselines are shown (see :func:`evidence`).

        Args:
            sample: the instance.
            rng: randomness for dealing evidence (seeded by the env, so views are reproducible).
            format_index: index into the format-diverse prompt pool, or ``None`` for base prompts.
        """

    @abc.abstractmethod
    def extract_answer(self, text: str) -> str | None:
        """The answer a turn carries (e.g. the last ``<A>...</A>``), or ``None``. Never raises."""

    @abc.abstractmethod
    def score(self, answer: str | None, sample: TaskSample) -> float:
        """The task score in [0, 1] of a final answer (``None`` = no answer was given)."""
