"""``ie/synth-v1``: the embedded task that only communication solves.

============  ==================================================================================
id            ``ie/synth-v1``
family        information exchange
agents        Alice, Bob (``num_agents`` up to 6; Alice speaks first)
each agent    the question, plus private facts. Hop 1 (who the person works for) goes to Alice:
              the person's fact and ``num_rivals`` other people's. Every later hop goes to the
              next agent in turn as a complete table: ``num_candidates`` facts mapping every
              entity of the previous kind to one of the next (the chain's entity among them).
              Every agent also holds ``num_distractors`` facts of each relation it does not hold,
              about entities found nowhere else in the instance.
end           the same answer twice in a row, or ``max_turns`` (spec §2.4)
metric        ``names-gold``: 1 when the final answer names the gold entity and no other candidate
              of the instance (any entity of the answer's kind), else 0; so a right answer said in
              a sentence gets full credit and a list of candidates none. F1 is reported beside it.
============  ==================================================================================

**The shortcut ceiling is 1/K** (``K = num_candidates``, 8 by default: 0.125). Call *bridging
facts* the chain facts that the final-hop holder (the agent with the last hop's table; Bob at 2
hops) does not hold. Given every fact of the instance but the bridging ones, the answer is uniform
over the K entities of the final-hop holder's table: the chain's index in each table is drawn
uniformly and independently of everything else (the rivals' employers are drawn from the same
table without regard to it, the tables are random bijections, every hand is shuffled, and names
are drawn from one generator with no word shared between two names). So no strategy that does not
pass the bridging facts on (naming the first or last candidate, the most frequent name, the name
the partner did not say, a name in both hands, the longest name, or a classifier over every other
fact) beats 1/K on average; :func:`shortcut_ceiling` returns it, and
``tests/plugins/test_synth_leaks.py`` checks it on 10,000 instances both ways.

The ceiling is stated for 2 hops, the demo's setting. From 3 hops on, a middle hop's table is
complete, so the check's premise (every fact but the bridging ones on the table) shows the
bridging fact as the table's one gap: the last holder could find the answer if told every other
fact of the middle table, which no agent can choose without the bridging fact's content.

The initialization samples with the information-exchange tasks' format-diverse prompt pool (spec
§4), as HotpotQA does; v0 has none.

Knobs: ``hops`` (2-4), ``num_candidates`` (K, at least 2), ``num_rivals`` (0 to K), and
``num_distractors`` (at least 0). ``style`` reads answers as in v0: ``"paper"`` the ``<A>`` tag only;
``"small"`` the tag, else ``Answer: x`` / ``the answer is x``, else the whole turn, which the metric
credits in full when it names the answer and no rival.

Version history:
    v0: ``ie/synth-v0`` (:mod:`optima_task_synth.v0`), whose answer was reachable without the chain
        fact (its docstring says how).
    v1: first release: the final-hop holder's complete table of K candidates, rivals drawn without
        regard to the chain, distractors about entities found nowhere else, ``names-gold``.
"""

from __future__ import annotations

import random
from typing import Any

from optima_env import TaskContractError, TaskSample
from optima_env.prompts import FORMAT_EXAMPLES
from optima_env.scoring import names_only
from optima_task_synth.common import ChainTask
from optima_task_synth.world import KINDS, RELATIONS, Fact, NameSource, question

__all__ = ["METRIC", "TASK_ID", "CommunicationChainTask", "generate_v1", "shortcut_ceiling"]

TASK_ID = "ie/synth-v1"
METRIC = "names-gold"


def holder(relation: int, num_agents: int) -> int:
    """The agent (by position) who holds the chain fact of ``relation``."""
    return relation % num_agents


def generate_v1(
    rng: random.Random,
    *,
    hops: int,
    num_candidates: int,
    num_rivals: int,
    num_distractors: int,
    num_agents: int,
) -> tuple[str, str, list[Fact], list[list[Fact]], list[str]]:
    """One instance: (question, answer, chain facts, per-agent facts, answer-kind candidates)."""
    names = NameSource(rng, strict=True)
    subject = names.fresh(KINDS[0])
    tables = {
        level: [names.fresh(KINDS[level]) for _ in range(num_candidates)] for level in range(1, hops + 1)
    }
    hands: list[list[Fact]] = [[] for _ in range(num_agents)]
    index = rng.randrange(num_candidates)
    chain = [Fact(0, subject, tables[1][index])]
    first = hands[holder(0, num_agents)]
    first.append(chain[0])
    for j in rng.sample(range(num_candidates), num_rivals):  # drawn without regard to ``index``
        first.append(Fact(0, names.fresh(KINDS[0]), tables[1][j]))
    for relation in range(1, hops):
        image = list(range(num_candidates))
        rng.shuffle(image)
        table = [
            Fact(relation, tables[relation][i], tables[relation + 1][image[i]]) for i in range(num_candidates)
        ]
        hands[holder(relation, num_agents)].extend(table)
        chain.append(table[index])
        index = image[index]
    for agent, hand in enumerate(hands):
        for relation in range(hops):
            if holder(relation, num_agents) == agent:
                continue
            for _ in range(num_distractors):
                hand.append(Fact(relation, names.fresh(KINDS[relation]), names.fresh(KINDS[relation + 1])))
        rng.shuffle(hand)
    candidates = [f.obj for hand in hands for f in hand if f.relation == hops - 1]
    return question(subject, hops), tables[hops][index], chain, hands, candidates


def shortcut_ceiling(num_candidates: int) -> float:
    """The best expected score without the bridging facts: 1/K (see the module docstring)."""
    return 1.0 / num_candidates


class CommunicationChainTask(ChainTask):
    """``ie/synth-v1`` (see the module docstring)."""

    metric = METRIC
    num_formats = len(FORMAT_EXAMPLES)
    _seed_prefix = "optima-synth-v1"

    # size: the generator's knobs, sizes, seed and answer reading, keyword arguments with defaults
    def __init__(
        self,
        *,
        hops: int = 2,
        num_candidates: int = 8,
        num_rivals: int = 2,
        num_distractors: int = 1,
        num_agents: int = 2,
        seed: int = 0,
        train_size: int = 10_000,
        test_size: int = 500,
        style: str = "paper",
        tag_answers: str = "code",
    ) -> None:
        if not isinstance(hops, int) or not 2 <= hops <= len(RELATIONS):
            raise TaskContractError(
                f"hops must be an int from 2 to {len(RELATIONS)} (one hop needs no exchange), got {hops!r}"
            )
        if not isinstance(num_candidates, int) or num_candidates < 2:
            raise TaskContractError(f"num_candidates must be an int >= 2, got {num_candidates!r}")
        if not isinstance(num_rivals, int) or not 0 <= num_rivals <= num_candidates:
            raise TaskContractError(
                f"num_rivals must be an int from 0 to num_candidates ({num_candidates}), got {num_rivals!r}"
            )
        if not isinstance(num_distractors, int) or num_distractors < 0:
            raise TaskContractError(f"num_distractors must be an int >= 0, got {num_distractors!r}")
        self.init_common(
            num_agents=num_agents, seed=seed, train_size=train_size, test_size=test_size, style=style,
            tag_answers=tag_answers,
        )  # fmt: skip
        self.hops, self.num_candidates = hops, num_candidates
        self.num_rivals, self.num_distractors = num_rivals, num_distractors

    @property
    def final_holder(self) -> str:
        """The agent holding the last hop's table: the one who can name the answer once told."""
        return self.agents[holder(self.hops - 1, len(self.agents))]

    def ceiling(self) -> float:
        """:func:`shortcut_ceiling` of this task."""
        return shortcut_ceiling(self.num_candidates)

    def generate(self, rng: random.Random) -> tuple[str, str, list[list[Fact]], dict[str, Any]]:
        text, answer, chain, hands, candidates = generate_v1(
            rng, hops=self.hops, num_candidates=self.num_candidates, num_rivals=self.num_rivals,
            num_distractors=self.num_distractors, num_agents=len(self.agents),
        )  # fmt: skip
        final = holder(self.hops - 1, len(self.agents))
        metadata = {
            "hops": self.hops,
            "subject": chain[0].subject,
            "chain": [[f.relation, f.subject, f.obj] for f in chain],
            "bridging": [i for i, _ in enumerate(chain) if holder(i, len(self.agents)) != final],
            "candidates": candidates,
        }
        return text, answer, hands, metadata

    def score(self, answer: str | None, sample: TaskSample) -> float:
        """1.0 when ``answer`` names the gold entity and no other candidate, else 0.0."""
        return names_only(answer, sample.answers, sample.metadata["candidates"])

    def scorer_name(self, tokenizer: Any = None) -> str:
        return METRIC

    def swap_evidence(self, sample: TaskSample, donor: TaskSample, agent: str) -> TaskSample:
        """``sample`` with ``agent``'s private facts replaced by ``donor``'s (the counterfactual
        control): the question and the gold answer stay ``sample``'s, the candidates are the
        answer-kind entities of the new hands."""
        position = self.agents.index(agent)
        context = tuple(
            d if i == position else p for i, (p, d) in enumerate(zip(sample.context, donor.context))
        )
        hands = [
            d if i == position else h
            for i, (h, d) in enumerate(zip(sample.metadata["hands"], donor.metadata["hands"]))
        ]
        candidates = [f[2] for hand in hands for f in hand if f[0] == self.hops - 1]
        metadata = {
            **sample.metadata,
            "hands": hands,
            "candidates": candidates,
            "evidence_of": {agent: donor.id},
        }
        return TaskSample(
            id=f"{sample.id}+{agent}:{donor.id}", question=sample.question, answers=sample.answers,
            context=context, metadata=metadata,
        )  # fmt: skip
