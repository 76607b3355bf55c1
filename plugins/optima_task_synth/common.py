"""What both versions of the synthetic task share: generated splits, the agents' prompts (the
paper's information-exchange prompt with each agent's own facts) and the answer reading."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from optima_env import AgentView, Paragraph, Task, TaskContractError, TaskSample
from optima_env.prompts import (
    FORMAT_EXAMPLES,
    INFORMATION_EXCHANGE_PROMPT,
    STYLES,
    join_names,
    render,
    with_format_block,
)
from optima_env.scoring import extract_answer_phrase, extract_tagged
from optima_env.task import agent_names
from optima_task_synth.world import Fact

__all__ = ["ChainTask", "hand_facts"]


def hand_facts(sample: TaskSample) -> list[list[Fact]]:
    """Each agent's private facts of a generated instance, in the order its prompt lists them."""
    return [[Fact(*f) for f in hand] for hand in sample.metadata["hands"]]


class _GeneratedSamples(Sequence[TaskSample]):
    def __init__(self, task: ChainTask, split: str, size: int) -> None:
        self._task, self._split, self._size = task, split, size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int) -> TaskSample:  # type: ignore[override]
        if not isinstance(index, int):
            raise TypeError("generated samples support integer indexing only")
        if index < 0:
            index += self._size
        if not 0 <= index < self._size:
            raise IndexError(f"index {index} out of range for {self._size} samples")
        return self._task.sample(self._split, index)


class ChainTask(Task):
    """A generated chain-QA task: splits of ``train_size`` / ``test_size`` instances, each a
    deterministic function of ``(seed, split, index)``, dealt to the agents as private facts."""

    family = "information_exchange"
    _seed_prefix = "optima-synth"
    num_formats = 0
    """The format-diverse prompt pool of the initialization (spec §4): v1 has the IE pool's."""

    def init_common(
        self, *, num_agents: int, seed: int, train_size: int, test_size: int, style: str, tag_answers: str
    ) -> None:
        """Check and store the settings every version has."""
        if style not in STYLES:
            raise TaskContractError(f"style must be one of {STYLES}, got {style!r}")
        if tag_answers not in ("code", "stripped"):
            raise TaskContractError(f"tag_answers must be 'code' or 'stripped', got {tag_answers!r}")
        self.tag_answers = tag_answers
        self.style = style
        self.agents = agent_names(num_agents)
        self.seed = seed
        self._sizes = {"train": train_size, "test": test_size}

    def samples(self, split: str) -> Sequence[TaskSample]:
        if split not in self._sizes:
            raise TaskContractError(
                f"unknown split {split!r} for {self.id}; expected one of {sorted(self._sizes)}"
            )
        return _GeneratedSamples(self, split, self._sizes[split])

    @lru_cache(maxsize=4096)  # noqa: B019 - the task lives as long as its samples
    def sample(self, split: str, index: int) -> TaskSample:
        """Instance ``index`` of ``split`` (deterministic)."""
        rng = random.Random(f"{self._seed_prefix}/{self.seed}/{split}/{index}")
        text, answer, hands, metadata = self.generate(rng)
        return TaskSample(
            id=f"synth-{self.seed}-{split}-{index}",
            question=text,
            answers=(answer,),
            context=tuple(
                Paragraph(title=agent, sentences=tuple(f.text for f in hand))
                for agent, hand in zip(self.agents, hands)
            ),
            metadata={
                **metadata,
                "hands": [[[f.relation, f.subject, f.obj] for f in hand] for hand in hands],
            },
        )

    def generate(self, rng: random.Random) -> tuple[str, str, list[list[Fact]], dict[str, Any]]:
        """One instance: (question, answer, per-agent facts, metadata)."""
        raise NotImplementedError

    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        if format_index is not None and not 0 <= format_index < self.num_formats:
            if self.num_formats == 0:
                raise TaskContractError(f"{self.id} has no format pool; got format_index={format_index!r}")
            raise TaskContractError(
                f"format_index must be in [0, {self.num_formats}) for {self.id}, got {format_index!r}"
            )
        views = {}
        for paragraph in sample.context:
            agent = paragraph.title
            partners = join_names([a for a in self.agents if a != agent])
            prompt = render(
                INFORMATION_EXCHANGE_PROMPT,
                name=agent,
                partner=partners,
                question=sample.question,
                information="\n".join(paragraph.sentences),
            )
            shown = prompt
            if format_index is not None:
                shown = with_format_block(prompt, FORMAT_EXAMPLES[format_index])
            views[agent] = AgentView(
                agent=agent, system_prompt=shown, base_system_prompt=prompt, private=paragraph.sentences
            )
        return views

    def extract_answer(self, text: str) -> str | None:
        if self.style == "small":
            return extract_answer_phrase(text, whole_text=True)
        return extract_tagged(text, "A", strip=self.tag_answers != "code")
