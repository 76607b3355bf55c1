"""Shortcut checks: how well a system could score without the bridging facts ever being said.

The *bridging facts* of an instance are the chain facts that the final-hop holder (the agent with
the answer's relation) does not hold. Everything here sees every other fact of the instance and
picks one of the final-hop holder's candidates (the objects of his answer-relation facts):

* :func:`strategy_scores`: hand-written strategies (first or last listed, the most frequent name,
  the name the partner did not say, a name in both hands, the longest name, ...), each scored as
  its exact expectation over a uniform tie-break;
* :func:`classifier_score`: a conditional-logit classifier over the candidates, trained on every
  fact but the bridging ones (position, length, alphabetical rank, counts, shared names, spelling).

On ``ie/synth-v0`` at the demo's old setting they find its leak (0.765 for "the city Alice did not
say"); on ``ie/synth-v1`` they stay at 1/K, the ceiling :func:`~optima_task_synth.v1.shortcut_ceiling`
states. NumPy only, so the checks run wherever the task does.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from optima_env import TaskSample
from optima_task_synth.common import hand_facts
from optima_task_synth.world import Fact

__all__ = ["STRATEGIES", "Visible", "classifier_score", "strategy_scores", "visible"]


class Visible:
    """What a shortcut may use of one instance: every hand without the bridging facts."""

    def __init__(self, sample: TaskSample, num_agents: int) -> None:
        hops = sample.metadata["hops"]
        final = (hops - 1) % num_agents
        bridging = {Fact(*sample.metadata["chain"][i]) for i in range(hops) if i % num_agents != final}
        self.hands = [[f for f in hand if f not in bridging] for hand in hand_facts(sample)]
        self.final = final
        self.gold = sample.answers[0]
        self.candidate_facts = [f for f in self.hands[final] if f.relation == hops - 1]
        self.candidates = [f.obj for f in self.candidate_facts]
        self.others = {
            n for i, hand in enumerate(self.hands) if i != final for f in hand for n in (f.subject, f.obj)
        }
        self.counts = Counter(n for hand in self.hands for f in hand for n in (f.subject, f.obj))


def visible(samples: Sequence[TaskSample], num_agents: int = 2) -> list[Visible]:
    """:class:`Visible` of each sample."""
    return [Visible(s, num_agents) for s in samples]


def _best(v: Visible, key: Callable[[int], float]) -> list[int]:
    values = [key(i) for i in range(len(v.candidates))]
    top = max(values)
    return [i for i, x in enumerate(values) if x == top]


def _kept(v: Visible, keep: Callable[[int], bool]) -> list[int]:
    chosen = [i for i in range(len(v.candidates)) if keep(i)]
    return chosen or list(range(len(v.candidates)))


STRATEGIES: dict[str, Callable[[Visible], list[int]]] = {
    "a candidate at random": lambda v: list(range(len(v.candidates))),
    "first listed": lambda v: [0],
    "last listed": lambda v: [len(v.candidates) - 1],
    "most frequent name": lambda v: _best(v, lambda i: v.counts[v.candidates[i]]),
    "most frequent subject": lambda v: _best(v, lambda i: v.counts[v.candidate_facts[i].subject]),
    "a name the partner did not say": lambda v: _kept(v, lambda i: v.candidates[i] not in v.others),
    "a name the partner said": lambda v: _kept(v, lambda i: v.candidates[i] in v.others),
    "a name in both hands": lambda v: _kept(
        v, lambda i: v.candidates[i] in v.others or v.candidate_facts[i].subject in v.others
    ),
    "a subject in no other hand": lambda v: _kept(v, lambda i: v.candidate_facts[i].subject not in v.others),
    "the longest name": lambda v: _best(v, lambda i: len(v.candidates[i])),
    "the shortest name": lambda v: _best(v, lambda i: -len(v.candidates[i])),
    "alphabetically first": lambda v: _best(v, lambda i: -sorted(v.candidates).index(v.candidates[i])),
}
"""Each strategy's choice among the final-hop holder's candidates (indices; ties split evenly)."""


def strategy_scores(instances: Sequence[Visible]) -> dict[str, float]:
    """Each strategy's expected exact-match score over ``instances`` (ties split uniformly)."""
    scores = {}
    for name, choose in STRATEGIES.items():
        total = 0.0
        for v in instances:
            chosen = choose(v)
            total += sum(v.candidates[i] == v.gold for i in chosen) / len(chosen)
        scores[name] = total / len(instances)
    return scores


def _bucket(text: str, buckets: int) -> int:
    return zlib.crc32(text.encode()) % buckets


def _features(v: Visible) -> np.ndarray:
    k = len(v.candidates)
    hand = v.hands[v.final]
    lengths = [len(c) for c in v.candidates]
    order = sorted(v.candidates)
    rows = []
    for i, (fact, name) in enumerate(zip(v.candidate_facts, v.candidates)):
        position = hand.index(fact) / max(len(hand) - 1, 1)
        spelling = np.zeros(24)
        spelling[_bucket(name[-3:], 12)] = 1.0
        spelling[12 + _bucket(name[:2], 12)] = 1.0
        dense = [
            position, float(i == 0), float(i == k - 1), i / max(k - 1, 1),
            lengths[i] / 12.0, float(lengths[i] == max(lengths)), float(lengths[i] == min(lengths)),
            order.index(name) / max(k - 1, 1), v.counts[name] / 2.0, v.counts[fact.subject] / 2.0,
            float(name in v.others), float(fact.subject in v.others), len(fact.subject) / 12.0,
        ]  # fmt: skip
        rows.append(np.concatenate([np.asarray(dense), spelling]))
    return np.stack(rows)


def _fit(data: list[tuple[np.ndarray, int]], steps: int, l2: float) -> np.ndarray:
    w = np.zeros(data[0][0].shape[1])
    for _ in range(steps):
        grad = l2 * w
        for x, gold in data:
            z = x @ w
            p = np.exp(z - z.max())
            p /= p.sum()
            grad += (x.T @ p - x[gold]) / len(data)
        w -= 0.5 * grad
    return w


def classifier_score(train: Sequence[Visible], test: Sequence[Visible], *, steps: int = 150) -> float:
    """Accuracy on ``test`` of a conditional-logit classifier fit on ``train`` to pick the gold
    among the final-hop holder's candidates from every visible fact (ties split uniformly)."""

    def labelled(instances: Sequence[Visible]) -> list[tuple[np.ndarray, list[int]]]:
        return [(_features(v), [i for i, c in enumerate(v.candidates) if c == v.gold]) for v in instances]

    fitted = [(x, golds[0]) for x, golds in labelled(train) if golds]
    w = _fit(fitted, steps, l2=1e-3)
    total = 0.0
    for x, golds in labelled(test):
        z = x @ w
        top = np.flatnonzero(z >= z.max() - 1e-12)
        total += len(set(top) & set(golds)) / len(top)
    return total / len(test)
