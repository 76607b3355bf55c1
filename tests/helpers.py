"""Test helpers importable as ``tests.helpers`` (a tiny inline task and its plugin)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

from optima_env import AgentView, Task, TaskSample, TaskSpec, hookimpl
from optima_env.scoring import extract_tagged, f1


class TinyTask(Task):
    """Two fixed instances; Alice knows the city, Bob the country; answers in <A></A>."""

    family = "information_exchange"

    def __init__(self, num_agents: int = 2) -> None:
        self.agents = ("Alice", "Bob", "Charlie")[:num_agents]
        self._samples = (
            TaskSample(id="tiny-0", question="Where does Ann live?", answers=("Paris",)),
            TaskSample(id="tiny-1", question="Where does Bo live?", answers=("Rome", "Roma")),
        )

    def samples(self, split: str) -> Sequence[TaskSample]:
        return self._samples

    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        return {
            a: AgentView(
                agent=a, system_prompt=f"You are {a}. {sample.question}", base_system_prompt=f"You are {a}."
            )
            for a in self.agents
        }

    def extract_answer(self, text: str) -> str | None:
        return extract_tagged(text, "A")

    def score(self, answer: str | None, sample: TaskSample) -> float:
        return f1(answer, sample.answers)


class TinyTaskPlugin:
    @hookimpl
    def optima_register_tasks(self) -> list[TaskSpec]:
        return [TaskSpec(id="test/tiny-v0", factory=TinyTask, family="information_exchange")]


REPO_ROOT = Path(__file__).resolve().parents[1]
