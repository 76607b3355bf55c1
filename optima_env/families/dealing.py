"""Dealing evidence between agents, as the reference dataloaders do (spec §2.1).

Pure functions of the sample and a ``random.Random``: the env seeds the generator, so the same
seed deals the same hands. Each returns one list of text units per agent, in dealing order; a unit
is one paragraph (or its first sentence), one search snippet or one story sentence. With two
agents the rules are exactly the reference code's; with more, "alternately" becomes round robin
and "50/50" becomes uniform over the agents.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from optima_env.errors import TaskContractError
from optima_env.types import Paragraph, TaskSample

__all__ = ["deal_halves", "deal_shuffled", "deal_supporting", "paragraph_unit"]


def paragraph_unit(paragraph: Paragraph, *, first_sentence_only: bool) -> str:
    """The text a paragraph contributes: its first sentence (HotpotQA quirk 1) or all of it.

    >>> p = Paragraph(title="T", sentences=("One.", " Two."))
    >>> paragraph_unit(p, first_sentence_only=True), paragraph_unit(p, first_sentence_only=False)
    ('One.', 'One. Two.')
    """
    if first_sentence_only:
        return paragraph.sentences[0].strip() if paragraph.sentences else ""
    return paragraph.text


def _check_agents(num_agents: int) -> None:
    if not isinstance(num_agents, int) or num_agents < 1:
        raise TaskContractError(f"num_agents must be a positive int, got {num_agents!r}")


def deal_supporting(
    sample: TaskSample,
    num_agents: int,
    rng: random.Random,
    *,
    shuffle: bool,
    first_sentence_only: bool,
    strict: bool = False,
) -> list[list[str]]:
    """Deal the supporting paragraphs in turn, then each distractor to a random agent.

    The reference rules (HotpotQA and 2WikiMultihopQA dataloaders):

    * ``sample.supporting_titles`` holds one entry per supporting *fact*, duplicates included;
      they are put in random order (``shuffle=True``, HotpotQA) or kept in listed order
      (2WikiMultihopQA), and entry ``i`` goes to agent ``i % num_agents``. So the same
      paragraph can reach two agents, or both gold paragraphs one agent (spec §2.1 quirk 2).
    * every context paragraph whose title is not a supporting title goes to a uniformly drawn
      agent (1/2 each for two agents), in context order.

    Args:
        sample: the instance (``context`` and ``supporting_titles`` are used).
        num_agents: number of hands.
        rng: the source of randomness.
        shuffle: deal the supporting titles in random order instead of listed order.
        first_sentence_only: a paragraph contributes only its first sentence (HotpotQA quirk 1).
        strict: spec §13 item 11's alternative: keep each supporting title once (first listed
            occurrence), so no paragraph reaches two agents and gold paragraphs alternate.

    Raises:
        TaskContractError: a supporting title names no context paragraph.
    """
    _check_agents(num_agents)
    text_of = {p.title: paragraph_unit(p, first_sentence_only=first_sentence_only) for p in sample.context}
    titles = list(dict.fromkeys(sample.supporting_titles) if strict else sample.supporting_titles)
    missing = [t for t in dict.fromkeys(titles) if t not in text_of]
    if missing:
        raise TaskContractError(
            f"sample {sample.id!r}: supporting title(s) {missing} name no context paragraph "
            f"(context titles: {list(text_of)}); fix the data row"
        )
    if shuffle:
        rng.shuffle(titles)
    hands: list[list[str]] = [[] for _ in range(num_agents)]
    for i, title in enumerate(titles):
        hands[i % num_agents].append(text_of[title])
    supporting = set(titles)
    for paragraph in sample.context:
        if paragraph.title not in supporting:
            hands[rng.randrange(num_agents)].append(
                paragraph_unit(paragraph, first_sentence_only=first_sentence_only)
            )
    return [[unit for unit in hand if unit] for hand in hands]


def deal_shuffled(units: Sequence[str], num_agents: int, rng: random.Random) -> list[list[str]]:
    """Shuffle the units and deal them in turn (TriviaQA search snippets).

    >>> deal_shuffled(["a", "b", "c"], 2, random.Random(0))
    [['a', 'b'], ['c']]
    """
    _check_agents(num_agents)
    order = [u.strip() for u in units]
    rng.shuffle(order)
    hands: list[list[str]] = [[] for _ in range(num_agents)]
    for i, unit in enumerate(order):
        if unit:
            hands[i % num_agents].append(unit)
    return hands


def deal_halves(units: Sequence[str], num_agents: int) -> list[list[str]]:
    """Contiguous chunks in order: with two agents the first half and the second half (CBT).

    The first agent gets ``int(len / 2)`` units, as the reference code does.

    >>> deal_halves(["s1", "s2", "s3", "s4", "s5"], 2)
    [['s1', 's2'], ['s3', 's4', 's5']]
    """
    _check_agents(num_agents)
    n = len(units)
    bounds = [n * k // num_agents for k in range(num_agents + 1)]
    return [[u.strip() for u in units[bounds[k] : bounds[k + 1]]] for k in range(num_agents)]
