"""Synthetic chain QA: the embedded default task, procedurally generated, no download needed.

============  ==================================================================================
id            ``ie/synth-v0``
family        information exchange
agents        Alice, Bob (``num_agents`` up to 6; Alice speaks first)
each agent    the question, plus private facts: the facts of the reasoning chain are dealt in
              turn (hop 1 to Alice, hop 2 to Bob, ...), and ``num_distractors`` facts about other
              entities of the same kinds go to each agent
end           the same ``<A>answer</A>`` twice in a row, or ``max_turns`` (spec §2.4)
metric        F1 between the final answer and the gold entity name, over the policy tokenizer's
              tokens as the reference code (``f1="squad"``: SQuAD normalization)
============  ==================================================================================

A small world of invented entities (people, companies, cities, countries, languages; names are
made up so no model can know them) is generated per instance. The question follows a chain of
``hops`` relations from a person, e.g. for 2 hops: *In which city is the company that Tavo Rinek
works for headquartered?* Because consecutive hops go to different agents and every agent also
holds distractor facts of every relation kind, no agent can answer alone: the agents must
exchange facts. :func:`solve` is a symbolic solver used by the tests to check exactly that.

Difficulty knobs: ``hops`` (1-4), ``num_distractors`` (per agent), ``num_agents``. ``hops=1`` is a
warm-up for very small models: Alice holds the one fact that answers (among rivals of the same
relation), the others hold only rivals, so the others can reach the answer only from what Alice
says and the conversation ends only once they repeat it; from 2 hops on no agent can answer alone.

``style`` picks how answers are read (the prompt is the paper's either way): ``"paper"`` (default)
takes ``<A>answer</A>`` only; ``"small"``, for models too small to write the tag, takes the tag,
else ``Answer: name`` / ``the answer is name``, else the whole turn (F1 then gives partial credit to
a turn that names the answer among other words). SmolLM2-135M never wrote the tag in the turns
sampled while building the demo, so under ``"paper"`` it scores exactly 0 and iterative training
has nothing to select; the demo suite (``python -m benchmarks.run --suite demo``) uses ``"small"``.
Instances are deterministic functions of ``(seed, split, index)``; train and test never overlap.
Scoring switches (:mod:`optima_env.families.scoring`): ``f1`` (``tokens``, the default, or
``squad``) and ``tag_answers`` (``code``: the ``<A>`` answer unstripped, as the reference; or
``stripped``).

Version history:
    v0: first release.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from optima_env import AgentView, Paragraph, Recipe, Task, TaskContractError, TaskSample, TaskSpec, hookimpl
from optima_env.families.scoring import TokenF1Scoring
from optima_env.prompts import INFORMATION_EXCHANGE_PROMPT, STYLES, join_names, render
from optima_env.scoring import extract_answer_phrase, extract_tagged
from optima_env.task import agent_names

__all__ = ["Fact", "SyntheticChainTask", "optima_register_recipes", "optima_register_tasks", "solve"]

TASK_ID = "ie/synth-v0"

# (subject kind, object kind, fact template, question fragment)
_RELATIONS = (
    ("person", "company", "{a} works for {b}.", "the company that {x} works for"),
    ("company", "city", "{a} is headquartered in {b}.", "the city where {x} is headquartered"),
    ("city", "country", "{a} is located in {b}.", "the country where {x} is located"),
    ("country", "language", "The official language of {a} is {b}.", "the official language of {x}"),
)
_SYLLABLES = (
    "ka ri to mel zan vor ple dru shi na bex qua lo fen tis gar mu wen ost ryn jal "
    "hex cor dal pim vur sel tha bru ke ivo lan"
).split()
_SUFFIX = {
    "company": ("Labs", "Corp", "Works", "Systems", "Group"),
    "city": ("", "ville", "ford", "burg", "haven"),
    "country": ("ia", "land", "stan", "ora", "ica"),
    "language": ("ish", "ese", "ic", "an", "i"),
}


@dataclass(frozen=True, slots=True)
class Fact:
    """One relation instance: ``subject --relation--> obj``."""

    relation: int
    subject: str
    obj: str

    @property
    def text(self) -> str:
        return _RELATIONS[self.relation][2].format(a=self.subject, b=self.obj)


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()


def _name(rng: random.Random, kind: str) -> str:
    if kind == "person":
        return f"{_word(rng, 2)} {_word(rng, 2)}"
    suffix = rng.choice(_SUFFIX[kind])
    base = _word(rng, 2)
    return f"{base} {suffix}" if kind == "company" else base + suffix


def _question(subject: str, hops: int) -> str:
    phrase = "{x}"
    for relation in range(hops - 1, -1, -1):
        phrase = phrase.format(x=_RELATIONS[relation][3])
    fragment = phrase.format(x=subject)
    kind = _RELATIONS[hops - 1][1]
    return f"What is {fragment}? (answer with the {kind}'s name)"


def generate(
    rng: random.Random, *, hops: int, num_distractors: int, num_agents: int
) -> tuple[str, str, list[Fact], list[list[Fact]]]:
    """One instance: (question, answer, chain facts, per-agent private facts)."""
    used: set[str] = set()

    def fresh(kind: str) -> str:
        while True:
            name = _name(rng, kind)
            if name not in used:
                used.add(name)
                return name

    chain_entities = [fresh(_RELATIONS[0][0])] + [fresh(_RELATIONS[r][1]) for r in range(hops)]
    chain = [Fact(r, chain_entities[r], chain_entities[r + 1]) for r in range(hops)]
    hands: list[list[Fact]] = [[] for _ in range(num_agents)]
    for r, fact in enumerate(chain):
        hands[r % num_agents].append(fact)
    objects_by_kind = {r: [chain_entities[r + 1]] for r in range(hops)}
    for hand in hands:
        for d in range(num_distractors):
            relation = (hops - 1 - d) % hops  # the answer's relation first: rival candidates
            subject = fresh(_RELATIONS[relation][0])
            # once a kind has two names, distractors reuse them half the time, so a name seen in
            # one fact says nothing on its own
            pool = objects_by_kind[relation]
            reuse = len(set(pool)) >= 2 and rng.random() < 0.5
            obj = rng.choice(pool) if reuse else fresh(_RELATIONS[relation][1])
            pool.append(obj)
            hand.append(Fact(relation, subject, obj))
        rng.shuffle(hand)
    question = _question(chain_entities[0], hops)
    return question, chain_entities[-1], chain, hands


def solve(question_subject: str, facts: Iterable[Fact], hops: int) -> str | None:
    """Follow ``hops`` relations from ``question_subject`` through ``facts``.

    Returns the unique end entity, or ``None`` when a link is missing (or ambiguous).
    """
    by_key: dict[tuple[int, str], set[str]] = {}
    for fact in facts:
        by_key.setdefault((fact.relation, fact.subject), set()).add(fact.obj)
    entity = question_subject
    for relation in range(hops):
        objs = by_key.get((relation, entity), set())
        if len(objs) != 1:
            return None
        (entity,) = objs
    return entity


class _GeneratedSamples(Sequence[TaskSample]):
    def __init__(self, task: SyntheticChainTask, split: str, size: int) -> None:
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


class SyntheticChainTask(TokenF1Scoring, Task):
    """The embedded default task (see the module docstring)."""

    family = "information_exchange"

    # size: the synthetic task's generator knobs (hops, rivals, sizes, seed), keyword arguments with defaults
    def __init__(
        self,
        *,
        hops: int = 2,
        num_distractors: int = 3,
        num_agents: int = 2,
        seed: int = 0,
        train_size: int = 10_000,
        test_size: int = 500,
        style: str = "paper",
        f1: str = "tokens",
        tag_answers: str = "code",
    ) -> None:
        if not isinstance(hops, int) or not 1 <= hops <= len(_RELATIONS):
            raise TaskContractError(f"hops must be an int from 1 to {len(_RELATIONS)}, got {hops!r}")
        if not isinstance(num_distractors, int) or num_distractors < 1:
            raise TaskContractError(
                "num_distractors must be an int >= 1 (a lone agent must see rival facts), "
                f"got {num_distractors!r}"
            )
        if style not in STYLES:
            raise TaskContractError(f"style must be one of {STYLES}, got {style!r}")
        if tag_answers not in ("code", "stripped"):
            raise TaskContractError(f"tag_answers must be 'code' or 'stripped', got {tag_answers!r}")
        self.init_f1(f1, None)
        self.tag_answers = tag_answers
        self.style = style
        self.agents = agent_names(num_agents)
        self.hops, self.num_distractors, self.seed = hops, num_distractors, seed
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
        rng = random.Random(f"optima-synth/{self.seed}/{split}/{index}")
        question, answer, chain, hands = generate(
            rng, hops=self.hops, num_distractors=self.num_distractors, num_agents=len(self.agents)
        )
        return TaskSample(
            id=f"synth-{self.seed}-{split}-{index}",
            question=question,
            answers=(answer,),
            context=tuple(
                Paragraph(title=agent, sentences=tuple(f.text for f in hand))
                for agent, hand in zip(self.agents, hands)
            ),
            metadata={
                "hops": self.hops,
                "subject": chain[0].subject,
                "chain": [[f.relation, f.subject, f.obj] for f in chain],
                "hands": [[[f.relation, f.subject, f.obj] for f in hand] for hand in hands],
            },
        )

    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        if format_index is not None:
            raise TaskContractError(f"{self.id} has no format pool; got format_index={format_index!r}")
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
            views[agent] = AgentView(
                agent=agent, system_prompt=prompt, base_system_prompt=prompt, private=paragraph.sentences
            )
        return views

    def extract_answer(self, text: str) -> str | None:
        if self.style == "small":
            return extract_answer_phrase(text, whole_text=True)
        return extract_tagged(text, "A", strip=self.tag_answers != "code")


# Recipes of the built-in trainers for this task (spec §5-§7 tables), registered as Recipe
# records below: the reference code's recipes, and as "paper" the
# paper's Table 8 values where they differ (spec §13 item 5). Synth (not a paper task) is sized for
# the embedded 135M model: its rewards are all negative, so theta_sft -0.5, theta_filter -1 and
# theta_diff 0.05 let the best of each group through (the top-70% and top-half cuts still apply).
_ISFT = {
    "sft.learning_rate": 2e-05,
    "sft.epochs": 1,
    "sft.batch_size": 8,
    "reward.lambda_token": 0.6,
    "reward.lambda_loss": 1.0,
    "selection.theta": -0.5,
    "generation.num_samples": 4,
    "generation.instances": 8,
    "iterations": 6,
}
RECIPES = {
    "code": {
        "isft": _ISFT,
        "idpo": {
            **_ISFT,
            "iterations": 1,
            "dpo.beta": 0.1,
            "tree.theta_filter": -1.0,
            "tree.theta_diff": 0.05,
            "tree.instances": 2,
        },
        "isft-dpo": {
            **_ISFT,
            "iterations": 1,
            "dpo.beta": 0.1,
            "tree.theta_filter": -1.0,
            "tree.theta_diff": 0.05,
            "tree.instances": 2,
        },
    },
    "paper": {"idpo": {"iterations": 5}},
}


@hookimpl
def optima_register_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id=TASK_ID,
            factory=SyntheticChainTask,
            family="information_exchange",
            description="Procedural chain QA; evidence split between agents (embedded default).",
        )
    ]


@hookimpl
def optima_register_recipes() -> list[Recipe]:
    return Recipe.table(TASK_ID, RECIPES)
