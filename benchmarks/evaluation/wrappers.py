"""How a method plays a task: the task's agents, views and scoring, wrapped.

=========================  =======================================================================
wrapper                    what the agents see
=========================  =======================================================================
:class:`SingleAgentTask`   one agent with the CoT prompt and every agent's evidence (CoT, SC)
:class:`StyledTask`        the task's agents with MAD (``natural``) or AutoForm prompts
:class:`OneHandTask`       one agent with the CoT prompt and only the final-hop holder's evidence:
                           what one hand alone can answer (a control)
:class:`SwappedEvidence`   the task's agents as the task deals them, but the first agent's
                           private evidence is another instance's (the counterfactual control):
                           a system that passes the evidence on falls to the shortcut ceiling
=========================  =======================================================================

Single-agent episodes are played in the same env with ``max_turns=1``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.evaluation.prompts import (
    AUTOFORM_STYLE,
    NATURAL_STYLE,
    answer_format,
    cot_prompt,
    styled_prompt,
)
from optima_env.errors import TaskContractError
from optima_env.families.scoring import score_with_tokenizer, scorer_name
from optima_env.task import Task, evidence, require_evidence
from optima_env.types import AgentView, TaskSample

__all__ = ["OneHandTask", "SingleAgentTask", "StyledTask", "SwappedEvidence", "final_holder"]


class _Wrapped(Task):
    def __init__(self, inner: Task) -> None:
        self.inner = inner
        self._split = "test"
        self._evidence_checked = False
        self.family = inner.family  # type: ignore[misc]
        self.bind(inner.id)

    def samples(self, split: str) -> Sequence[TaskSample]:
        self._split = split
        return self.inner.samples(split)

    def evidence(self, views: Mapping[str, AgentView]) -> tuple[str, ...]:
        """The instance's evidence (:func:`optima_env.task.evidence`); the first time an
        information-exchange instance has none, the task is checked to declare evidence at all
        (:func:`~optima_env.task.require_evidence` on the split's first instances), so a task
        that hides it fails instead of playing its baselines on the bare question."""
        units = evidence(views)
        if not units and not self._evidence_checked:
            require_evidence(self.inner, self.inner.samples(self._split)[:3])
            self._evidence_checked = True
        return units

    def extract_answer(self, text: str) -> str | None:
        return self.inner.extract_answer(text)

    def score(self, answer: str | None, sample: TaskSample) -> float:
        return self.inner.score(answer, sample)

    def score_with(self, answer: str | None, sample: TaskSample, *, tokenizer: Any = None) -> float:
        """The inner task's score with the policy's tokenizer (its token F1, if it has one)."""
        return score_with_tokenizer(self.inner, answer, sample, tokenizer)

    def scorer_name(self, tokenizer: Any = None) -> str:
        """The inner task's scorer."""
        return scorer_name(self.inner, tokenizer)


class SingleAgentTask(_Wrapped):
    """The task played by one agent that sees everything (the CoT and SC baselines)."""

    enforce_name_prefix = False

    def __init__(self, inner: Task) -> None:
        super().__init__(inner)
        self.agents = (inner.agents[0],)
        kind = answer_format(inner)
        if kind is None:
            raise TaskContractError(
                f"task {inner.id!r}: its extractor reads neither <A>...</A> nor \\boxed{{...}}, so the "
                "single-agent baselines cannot tell the model how to answer; run --methods mad"
            )
        self.kind = kind

    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        inner_views = self.inner.views(sample, rng=rng, format_index=None)
        information = self.evidence(inner_views)
        prompt = cot_prompt(sample, information, kind=self.kind)
        agent = self.agents[0]
        return {
            agent: AgentView(
                agent=agent, system_prompt=prompt, base_system_prompt=prompt, private=tuple(information)
            )
        }


class StyledTask(_Wrapped):
    """The task's agents, roles and evidence with MAD (``natural``) or AutoForm prompts."""

    def __init__(self, inner: Task, style: str) -> None:
        super().__init__(inner)
        if style not in ("natural", "autoform"):
            raise TaskContractError(f"style must be 'natural' or 'autoform', got {style!r}")
        self.agents = tuple(inner.agents)
        self.enforce_name_prefix = inner.enforce_name_prefix
        self.style = style
        self.kind = answer_format(inner)

    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        own = getattr(self.inner, "styled_views", None)
        if callable(own):
            views = own(sample, rng=rng, style=self.style)
            if views is not None:
                return views
        views = self.inner.views(sample, rng=rng, format_index=None)
        self.evidence(views)
        if self.kind is None:  # unknown answer format: keep the task's own prompts
            return views
        text = NATURAL_STYLE if self.style == "natural" else AUTOFORM_STYLE
        out = {}
        for agent, view in views.items():
            prompt = styled_prompt(
                name=agent,
                partners=[a for a in self.agents if a != agent],
                role=view.role,
                sample=sample,
                private=view.private,
                kind=self.kind,
                style=text,
                family=self.family,
            )
            out[agent] = dataclasses.replace(view, system_prompt=prompt, base_system_prompt=prompt)
        return out


def final_holder(task: Task) -> str:
    """The agent whose evidence answers the last hop (``task.final_holder`` where the task says;
    else its last agent)."""
    named = getattr(task, "final_holder", None)
    return named if isinstance(named, str) else task.agents[-1]


class OneHandTask(SingleAgentTask):
    """One agent with the CoT prompt and only the final-hop holder's private evidence."""

    def __init__(self, inner: Task) -> None:
        super().__init__(inner)
        self.holder = final_holder(inner)
        self.agents = (self.holder,)

    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        inner_views = self.inner.views(sample, rng=rng, format_index=None)
        information = tuple(inner_views[self.holder].private)
        if not information:
            raise TaskContractError(
                f"task {self.inner.id!r}: its final-hop holder {self.holder!r} has no private evidence, so "
                "the one-hand control has nothing to play; it needs an information-exchange task"
            )
        prompt = cot_prompt(sample, information, kind=self.kind)
        return {
            self.holder: AgentView(
                agent=self.holder, system_prompt=prompt, base_system_prompt=prompt, private=information
            )
        }


class _Swapped(Sequence[TaskSample]):
    def __init__(self, task: Task, samples: Sequence[TaskSample], agent: str) -> None:
        self._task, self._samples, self._agent = task, samples, agent

    def __len__(self) -> int:
        return len(self._samples)

    def __getitem__(self, index: int) -> TaskSample:  # type: ignore[override]
        if not isinstance(index, int):
            raise TypeError("swapped samples support integer indexing only")
        donor = self._samples[(index + 1) % len(self._samples)]
        return self._task.swap_evidence(self._samples[index], donor, self._agent)  # type: ignore[attr-defined]


class SwappedEvidence(_Wrapped):
    """The task as dealt, but instance ``i``'s first agent holds instance ``i + 1``'s evidence
    (the task's ``swap_evidence(sample, donor, agent)``): the question, the other agents' evidence
    and the gold stay instance ``i``'s."""

    def __init__(self, inner: Task) -> None:
        if not callable(getattr(inner, "swap_evidence", None)):
            raise TaskContractError(
                f"task {inner.id!r} cannot swap an agent's evidence (it has no swap_evidence(sample, "
                "donor, agent)), so it has no counterfactual control; play it without --controls"
            )
        super().__init__(inner)
        self.agents = tuple(inner.agents)
        self.enforce_name_prefix = inner.enforce_name_prefix
        self.agent = inner.agents[0]

    def samples(self, split: str) -> Sequence[TaskSample]:
        return _Swapped(self.inner, super().samples(split), self.agent)

    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        return self.inner.views(sample, rng=rng, format_index=format_index)
