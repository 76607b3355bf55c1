"""``ie/synth-v0``: the first synthetic chain task. Kept registered for the results made with it;
new work uses ``ie/synth-v1`` (:mod:`optima_task_synth.v1`).

============  ==================================================================================
id            ``ie/synth-v0``
family        information exchange
agents        Alice, Bob (``num_agents`` up to 6; Alice speaks first)
each agent    the question, plus private facts: the facts of the reasoning chain are dealt in
              turn (hop 1 to Alice, hop 2 to Bob, ...), and ``num_distractors`` facts go to each
              agent, the answer's relation first, then the relations before it
end           the same ``<A>answer</A>`` twice in a row, or ``max_turns`` (spec §2.4)
metric        F1 between the final answer and the gold entity name, over the policy tokenizer's
              tokens as the reference code (``f1="squad"``: SQuAD normalization)
============  ==================================================================================

**What it leaks.** No agent can answer from its own facts alone (:func:`~optima_task_synth.solve`
finds the answer only in the union), but the answer is reachable without the chain fact ever
being said. At ``num_distractors=1`` (the demo's setting until v1) every distractor is of the
answer's relation: Alice holds her person's employer and one rival city, Bob the answer's city and
one rival city, and Alice's city is never the answer. Computed from the generator on the first 100
test instances: Bob naming one of his two cities at random scores 0.61 (distractors reuse the
answer's name half the time); Alice saying her city and Bob naming his other one scores 0.765.
``tests/plugins/test_synth_leaks.py`` reproduces both, so the leak check is known to catch a leak.

Difficulty knobs: ``hops`` (1-4), ``num_distractors`` (per agent), ``num_agents``. ``hops=1`` is a
warm-up for very small models: Alice holds the one fact that answers (among rivals of the same
relation), the others hold only rivals.

``style`` picks how answers are read (the prompt is the paper's either way): ``"paper"`` (default)
takes ``<A>answer</A>`` only; ``"small"``, for models too small to write the tag, takes the tag,
else ``Answer: name`` / ``the answer is name``, else the whole turn (F1 then gives partial credit to
a turn that names the answer among other words). Scoring switches
(:mod:`optima_env.families.scoring`): ``f1`` (``tokens``, the default, or ``squad``) and
``tag_answers`` (``code``: the ``<A>`` answer unstripped, as the reference; or ``stripped``).

Version history:
    v0: first release.
    v1: ``ie/synth-v1``, a new task id (:mod:`optima_task_synth.v1`); this one is unchanged.
"""

from __future__ import annotations

import random
from typing import Any

from optima_env import TaskContractError
from optima_env.families.scoring import TokenF1Scoring
from optima_task_synth.common import ChainTask
from optima_task_synth.world import RELATIONS, Fact, NameSource, question

__all__ = ["TASK_ID", "SyntheticChainTask", "generate"]

TASK_ID = "ie/synth-v0"


def generate(
    rng: random.Random, *, hops: int, num_distractors: int, num_agents: int
) -> tuple[str, str, list[Fact], list[list[Fact]]]:
    """One instance: (question, answer, chain facts, per-agent private facts)."""
    fresh = NameSource(rng).fresh
    chain_entities = [fresh(RELATIONS[0][0])] + [fresh(RELATIONS[r][1]) for r in range(hops)]
    chain = [Fact(r, chain_entities[r], chain_entities[r + 1]) for r in range(hops)]
    hands: list[list[Fact]] = [[] for _ in range(num_agents)]
    for r, fact in enumerate(chain):
        hands[r % num_agents].append(fact)
    objects_by_kind = {r: [chain_entities[r + 1]] for r in range(hops)}
    for hand in hands:
        for d in range(num_distractors):
            relation = (hops - 1 - d) % hops  # the answer's relation first: rival candidates
            subject = fresh(RELATIONS[relation][0])
            # once a kind has two names, distractors reuse them half the time
            pool = objects_by_kind[relation]
            reuse = len(set(pool)) >= 2 and rng.random() < 0.5
            obj = rng.choice(pool) if reuse else fresh(RELATIONS[relation][1])
            pool.append(obj)
            hand.append(Fact(relation, subject, obj))
        rng.shuffle(hand)
    text = question(chain_entities[0], hops)
    return text, chain_entities[-1], chain, hands


class SyntheticChainTask(TokenF1Scoring, ChainTask):
    """``ie/synth-v0`` (see the module docstring)."""

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
        if not isinstance(hops, int) or not 1 <= hops <= len(RELATIONS):
            raise TaskContractError(f"hops must be an int from 1 to {len(RELATIONS)}, got {hops!r}")
        if not isinstance(num_distractors, int) or num_distractors < 1:
            raise TaskContractError(
                "num_distractors must be an int >= 1 (a lone agent must see rival facts), "
                f"got {num_distractors!r}"
            )
        self.init_common(
            num_agents=num_agents, seed=seed, train_size=train_size, test_size=test_size, style=style,
            tag_answers=tag_answers,
        )  # fmt: skip
        self.init_f1(f1, None)
        self.hops, self.num_distractors = hops, num_distractors

    def generate(self, rng: random.Random) -> tuple[str, str, list[list[Fact]], dict[str, Any]]:
        text, answer, chain, hands = generate(
            rng, hops=self.hops, num_distractors=self.num_distractors, num_agents=len(self.agents)
        )
        metadata = {
            "hops": self.hops,
            "subject": chain[0].subject,
            "chain": [[f.relation, f.subject, f.obj] for f in chain],
        }
        return text, answer, hands, metadata
