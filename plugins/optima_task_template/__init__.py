"""Template task: two agents each hold one clue of a two-step riddle. Copy it to start a plugin.

============  ==================================================================================
id            ``example/template-v0``
family        information exchange
agents        Alice, Bob (``num_agents`` up to 6; Alice speaks first)
each agent    the question, and its clue(s): clue ``i`` goes to agent ``i % num_agents``
end           the same ``<A>answer</A>`` twice in a row, or ``max_turns`` (spec §2.4)
metric        F1 between the final answer and the gold answer (SQuAD normalization)
============  ==================================================================================

This task is deliberately **not** registered by default (it is an example, not a benchmark).
To try it, add it to a plugin manager by hand::

    import optima_env, optima_task_template
    pm = optima_env.get_plugin_manager()
    pm.register(optima_task_template, name="template")
    env = optima_env.make("example/template-v0", pm=pm)

or declare it in your own ``pyproject.toml`` (``[project.entry-points.optima]
template = "optima_task_template"``) and reinstall. See README, "Writing a task plugin".

Version history:
    v0: first release.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from optima_env import AgentView, Paragraph, Recipe, Task, TaskContractError, TaskSample, TaskSpec, hookimpl
from optima_env.prompts import INFORMATION_EXCHANGE_PROMPT, join_names, render
from optima_env.scoring import extract_tagged, f1
from optima_env.task import agent_names

__all__ = ["TemplateTask", "optima_register_recipes", "optima_register_tasks"]

# (question, answer, clue for the first agent, clue for the second agent)
ROWS = {
    "train": [
        (
            "Where does Mira Tol live?",
            "Qesh",
            "Mira Tol lives on Lantern Island.",
            "Lantern Island's city is Qesh.",
        ),
        ("What colour is Ovo's boat?", "teal", "Ovo owns the boat named Wisp.", "The boat Wisp is teal."),
    ],
    "test": [
        (
            "Which river flows past Dorn's school?",
            "Sable",
            "Dorn studies at Brightfield.",
            "Brightfield is on the Sable.",
        ),
    ],
}


class TemplateTask(Task):
    """Two-clue riddles (see the module docstring)."""

    family = "information_exchange"

    def __init__(self, *, num_agents: int = 2) -> None:
        self.agents = agent_names(num_agents)

    def samples(self, split: str) -> Sequence[TaskSample]:
        if split not in ROWS:
            raise TaskContractError(f"unknown split {split!r}; expected one of {sorted(ROWS)}")
        return [
            TaskSample(
                id=f"template-{split}-{i}",
                question=question,
                answers=(answer,),
                context=tuple(Paragraph(title=f"clue {k}", sentences=(c,)) for k, c in enumerate(clues)),
            )
            for i, (question, answer, *clues) in enumerate(ROWS[split])
        ]

    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        if format_index is not None:
            raise TaskContractError(f"{self.id} has no format pool; got format_index={format_index!r}")
        hands: list[list[str]] = [[] for _ in self.agents]
        for k, clue in enumerate(sample.context):
            hands[k % len(self.agents)].append(clue.text)
        views = {}
        for agent, hand in zip(self.agents, hands):
            partners = join_names([a for a in self.agents if a != agent])
            prompt = render(
                INFORMATION_EXCHANGE_PROMPT,
                name=agent,
                partner=partners,
                question=sample.question,
                information="\n".join(hand),
            )
            views[agent] = AgentView(
                agent=agent, system_prompt=prompt, base_system_prompt=prompt, private=tuple(hand)
            )
        return views

    def extract_answer(self, text: str) -> str | None:
        return extract_tagged(text, "A")

    def score(self, answer: str | None, sample: TaskSample) -> float:
        return f1(answer, sample.answers)


# The trainers' hyperparameters for this task (README, "Recipes"): {preset: {trainer: dotted
# configuration names to values}}, registered as Recipe records below; "paper" would hold what a
# paper's tables change. State only what differs from the defaults. Without a recipe a task trains
# with the generic defaults (and a notice).
RECIPES = {
    "code": {
        "isft": {"selection.theta": 0.3, "generation.num_samples": 8, "iterations": 4},
        "idpo": {"selection.theta": 0.3, "tree.theta_filter": 0.3, "iterations": 3},
    },
}
# This task's reward thresholds (RewardConfig fields). A right answer here is a two-turn exchange of
# about 12 tokens, so the reference's "40 tokens or fewer scores -1" rule would punish exactly the
# conversations we want: lower it to 6. Agents agree by repeating a bare <A>tag</A>, which the
# reference would count as a repeated turn (readability 0): turn that rule off.
REWARD = {"short_trajectory_tokens": 6, "repeated_turn_zero_loss": False}


@hookimpl
def optima_register_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id="example/template-v0",
            factory=TemplateTask,
            family="information_exchange",
            reward=REWARD,
        )
    ]


@hookimpl
def optima_register_recipes() -> list[Recipe]:
    return Recipe.table("example/template-v0", RECIPES)
