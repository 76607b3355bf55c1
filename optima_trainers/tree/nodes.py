"""The turn tree of the MCTS-style data generation (spec §6.2, §6.4).

A :class:`Node` is one turn of a conversation (its text, ``"Name: ..."``); the root is the empty
conversation. The agent who speaks a node's children is ``agents[depth % len(agents)]`` (the root's
children: Alice). A node's value is the running mean of the rewards of every finished trajectory
through it; each parent also tracks its min- and max-value child, as the reference code does.

:class:`Tree` grows by :meth:`Tree.insert` (a finished trajectory from a start node: each new turn
is merged into an existing child when their normalized edit distance is below the merge threshold,
else it becomes a new child; then the reward is back-propagated), offers its selection candidates
(:meth:`Tree.candidates`) and cuts preference pairs (:meth:`Tree.pairs`; every candidate pair
with why it is kept or dropped: :meth:`Tree.pair_candidates`, the rules in
:func:`optima_trainers.dpo.pairs.candidate_pairs`). Beside its value, a node tracks what those rules
read: its task credit, mean reward terms, depth cuts and whether its turn ran to the cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import editdistance

from optima_env.errors import TaskContractError
from optima_env.rules import AnswerTracker, check_termination
from optima_env.types import Episode, Turn
from optima_trainers.config.sections import GenerationConfig
from optima_trainers.config.tree import TreeSearchConfig
from optima_trainers.dpo.pairs import candidate_pairs
from optima_trainers.run.records import PairCandidate, PreferencePair

__all__ = ["Node", "Tree", "TreeTrajectory", "normalized_edit_distance"]


def normalized_edit_distance(
    a: str, b: str, *, by: Literal["max", "new"] = "max", form: Literal["plus_one", "max_length"] = "plus_one"
) -> float:
    """Character edit distance, normalized (spec §6.2, §13 item 8).

    ``form="plus_one"`` (the reference code): over ``max(len(a), len(b)) + 1`` (``by="max"``, the
    selection filter) or over ``len(b) + 1`` (``by="new"``, the sibling merge; ``b`` is the new
    text). ``form="max_length"`` (the paper): over ``max(len(a), len(b))`` for both (0 for two
    empty texts).

    >>> normalized_edit_distance("abcd", "abcf")
    0.2
    >>> normalized_edit_distance("abcd", "abc", by="new")
    0.25
    >>> normalized_edit_distance("abcd", "abc", by="new", form="max_length")
    0.25
    >>> normalized_edit_distance("abcd", "abcf", form="max_length")
    0.25
    """
    distance = editdistance.eval(a, b)
    if form == "max_length":
        longest = max(len(a), len(b))
        return distance / longest if longest else 0.0
    return distance / ((max(len(a), len(b)) if by == "max" else len(b)) + 1)


class Node:
    """One turn in the tree (mutable: values and children change as the search runs)."""

    __slots__ = (
        "answer",
        "capped",
        "children",
        "current_answer",
        "depth",
        "depth_cuts",
        "ended",
        "id",
        "max_child",
        "min_child",
        "parent",
        "readability_sum",
        "scored",
        "task_sum",
        "text",
        "token_sum",
        "value",
        "visits",
    )

    def __init__(self, *, id: int, text: str, depth: int, parent: Node | None, answer: str | None) -> None:
        self.id = id
        self.text = text
        self.depth = depth
        self.parent = parent
        self.answer = answer
        """The answer this turn carries (task extraction), or ``None``."""
        self.current_answer: str | None = (
            answer if answer is not None else (parent.current_answer if parent else None)
        )
        """The conversation's current answer after this turn (spec §2.4), along the node texts."""
        self.ended = False
        """Replaying the path of node texts ends the conversation here (it cannot be continued)."""
        self.children: list[Node] = []
        self.value = 0.0
        self.visits = 0
        self.max_child: Node | None = None
        self.min_child: Node | None = None
        self.capped = False
        """This turn ran to the generation cap (``generation.max_new_tokens``, or it ended its
        episode as ``turn_too_long``): where it stops is the cap's, not the model's."""
        self.task_sum = 0.0
        """Sum of the task terms of the trajectories through the node (the scored reward's
        ``task`` term, or the episode's ``task_score`` when the reward came as a float)."""
        self.token_sum = 0.0
        """Sum of the token terms of the ``scored`` trajectories through the node."""
        self.readability_sum = 0.0
        """Sum of the readability terms of the ``scored`` trajectories through the node."""
        self.scored = 0
        """Trajectories through the node that came with their reward breakdown (``episode.reward``)."""
        self.depth_cuts = 0
        """Trajectories through the node that the depth limit cut (``end_reason == "max_turns"``)."""

    @property
    def task_credit(self) -> float:
        """The mean task term of the trajectories through the node (0 before any)."""
        return self.task_sum / self.visits if self.visits else 0.0

    def mean_term(self, name: Literal["token", "readability"]) -> float | None:
        """The mean ``token`` or ``readability`` term of the scored trajectories (``None``: none)."""
        return getattr(self, f"{name}_sum") / self.scored if self.scored else None

    def update_min_max(self, child: Node) -> None:
        """The reference code's incremental tracking, called after ``child``'s value changed."""
        if self.min_child is None or child.value < self.min_child.value:
            self.min_child = child
        if self.max_child is None or child.value > self.max_child.value:
            self.max_child = child

    def best_and_worst(self, mode: Literal["exact", "code"] = "exact") -> tuple[Node, Node]:
        """(max-value child, min-value child): recomputed from the current values (``exact``), or
        as tracked incrementally during back-propagation (``code``: can be stale, since a tracked
        child's running mean may drift below/above a sibling's later)."""
        if not self.children:
            raise TaskContractError(f"node {self.id} has no children")
        if mode == "code":
            if self.max_child is None or self.min_child is None:
                raise TaskContractError(f"node {self.id} has children but no back-propagated value yet")
            return self.max_child, self.min_child
        best = max(self.children, key=lambda n: n.value)  # first of equals, in insertion order
        worst = min(self.children, key=lambda n: n.value)
        return best, worst

    def __repr__(self) -> str:
        return (
            f"Node(id={self.id}, depth={self.depth}, value={self.value:.4g}, visits={self.visits}, "
            f"text={self.text[:40]!r})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeTrajectory:
    """One finished rollout of the search: where it started, its episode and its reward."""

    step: int
    """The selection step (0-based) that produced it."""
    start_depth: int
    """Depth of the selected node it continued from (its first ``start_depth`` turns are the prefix)."""
    episode: Episode
    reward: float


class Tree:
    """The search tree of one task instance.

    Args:
        task_id, sample_id, index, split, seed: which instance, and the env seed every rollout of
            the tree uses (so every rollout sees the same dealing of evidence).
        agents: the speaking order.
        system_prompts: each agent's base system prompt (what training examples use, spec §4).
        search: the tree-search settings (:class:`~optima_trainers.config.train.TreeSearchConfig`: the
            pair rule, the min/max tracking, the filtered parents, the edit-distance form, the
            merge threshold and the pair thresholds); default: the ``code`` preset's.
        generation: the conversation settings the tree replays (:class:`~optima_trainers.config.train.
            GenerationConfig`: ``max_turns`` cuts a path, ``termination`` decides where a path of
            node texts ends (:attr:`Node.ended`), ``message_format`` how turns appear in a pair's
            prompt: ``code``, all ``assistant``, or ``alternating``).
    """

    # size: the tree's instance (task, sample, index, split, seed, agents, prompts) and its 2 config sections
    def __init__(
        self,
        *,
        task_id: str,
        sample_id: str,
        index: int,
        split: str,
        seed: int,
        agents: tuple[str, ...],
        system_prompts: Mapping[str, str],
        search: TreeSearchConfig | None = None,
        generation: GenerationConfig | None = None,
    ) -> None:
        self.task_id, self.sample_id, self.index = task_id, sample_id, index
        self.split, self.seed = split, seed
        self.agents = tuple(agents)
        self.system_prompts = dict(system_prompts)
        self.search = search if search is not None else TreeSearchConfig()
        self.generation = generation if generation is not None else GenerationConfig()
        check_termination(self.generation.termination)
        for name, allowed in (
            ("pair_rule", ("per_parent", "shared_ancestor")),
            ("filtered_parents", ("drop", "keep")),
            ("minmax", ("exact", "code")),
            ("edit_distance", ("plus_one", "max_length")),
        ):
            if getattr(self.search, name) not in allowed:
                raise TaskContractError(
                    f"tree.{name} must be one of {allowed}, got {getattr(self.search, name)!r}"
                )
        self.root = Node(id=0, text="", depth=0, parent=None, answer=None)
        self.nodes: list[Node] = [self.root]
        self.selected: list[Node] = []
        self.removed: set[int] = set()
        """Ids of the nodes the selection's similarity filter removed (the reference deletes them
        from its node list: never a candidate again, nor a pair parent unless selected)."""
        self.trajectories: list[TreeTrajectory] = []

    # -- structure ----------------------------------------------------------------------------------
    def speaker(self, node: Node) -> str:
        """The agent who speaks ``node``'s children."""
        return self.agents[node.depth % len(self.agents)]

    def path(self, node: Node) -> list[Node]:
        """The nodes from the root to ``node``, both included."""
        out = []
        current: Node | None = node
        while current is not None:
            out.append(current)
            current = current.parent
        return out[::-1]

    def prefix(self, node: Node) -> list[str]:
        """The turn texts that lead to ``node`` (empty for the root)."""
        return [n.text for n in self.path(node)[1:]]

    def candidates(self) -> list[Node]:
        """Nodes the search may continue from: the root and every node whose first child itself has
        children (so no leaf and no second-to-last-level node), minus paths that already ended."""
        return [
            n
            for n in self.nodes
            if (n is self.root or (n.children and n.children[0].children)) and not n.ended
        ]

    # -- growth -------------------------------------------------------------------------------------
    def insert(self, episode: Episode, start: Node, reward: float, *, step: int = 0) -> Node:
        """Add a finished trajectory that continued from ``start``; returns its leaf.

        The episode's first ``start.depth`` turns must be the texts of ``start``'s path. Each later
        turn goes into an existing child of the current node when ``ed(child, new) / (len(new) + 1)
        < tree.merge_edit_threshold`` (the first such child), else into a new child. ``reward`` is then
        back-propagated as a running mean along the whole path, root included, with the episode's
        task term, reward terms (when ``episode.reward`` holds its breakdown) and depth cut
        (:attr:`Node.task_credit`, :meth:`Node.mean_term`, :attr:`Node.depth_cuts`).
        """
        expected = self.prefix(start)
        got = [t.text for t in episode.turns[: start.depth]]
        if got != expected:
            raise TaskContractError(
                f"tree {self.sample_id}: the episode does not continue node {start.id}: its first "
                f"{start.depth} turns {got!r} differ from the node's path {expected!r}"
            )
        if len(episode.turns) <= start.depth:
            raise TaskContractError(f"tree {self.sample_id}: the episode adds no turn after node {start.id}")
        visited = self.path(start)
        node = start
        last = len(episode.turns) - 1
        for i, turn in enumerate(episode.turns[start.depth :], start=start.depth):
            child = next(
                (
                    c
                    for c in node.children
                    if normalized_edit_distance(c.text, turn.text, by="new", form=self.search.edit_distance)
                    < self.search.merge_edit_threshold
                ),
                None,
            )
            if child is None:
                too_long = i == last and episode.end_reason == "turn_too_long"
                child = self._add_child(node, turn, too_long=too_long)
                child.capped = too_long or turn.num_tokens >= self.generation.max_new_tokens
            node = child
            visited.append(node)
        terms = episode.reward
        task = terms.task if terms is not None else episode.task_score
        for n in reversed(visited):  # leaf to root, as the reference back-propagates
            n.visits += 1
            n.value = (n.value * (n.visits - 1) + reward) / n.visits
            n.task_sum += task
            n.depth_cuts += episode.end_reason == "max_turns"
            if terms is not None:
                n.scored += 1
                n.token_sum += terms.token
                n.readability_sum += terms.readability
            if n.parent is not None:
                n.parent.update_min_max(n)
        self.trajectories.append(
            TreeTrajectory(step=step, start_depth=start.depth, episode=episode, reward=reward)
        )
        return node

    def _add_child(self, parent: Node, turn: Turn, *, too_long: bool) -> Node:
        node = Node(
            id=len(self.nodes), text=turn.text, depth=parent.depth + 1, parent=parent, answer=turn.answer
        )
        # a merged variant can continue a path that the node texts end (its own answer differed):
        # whatever follows an ended node ends too, or replaying its path would stop short of it
        node.ended = parent.ended or too_long or node.depth >= self.generation.max_turns or self._agrees(node)
        parent.children.append(node)
        self.nodes.append(node)
        return node

    def _agrees(self, node: Node) -> bool:
        """Replaying the path's texts, the env's agreement rule ends the conversation at ``node``."""
        tracker = AnswerTracker(self.generation.termination, self.agents)
        path = self.path(node)[1:]
        agreed = False
        for i, n in enumerate(path):
            agreed = tracker.update(self.agents[i % len(self.agents)], n.answer)
        return agreed

    def pair_parents(self) -> list[Node]:
        """Nodes with two or more children that may give pairs, in creation order (with
        ``filtered_parents="drop"``, not those the similarity filter removed and never selected)."""
        selected = {n.id for n in self.selected}
        return [
            n
            for n in self.nodes
            if len(n.children) >= 2
            and (self.search.filtered_parents == "keep" or n.id not in self.removed or n.id in selected)
        ]

    # -- data ---------------------------------------------------------------------------------------
    def prompt_messages(self, node: Node) -> list[dict[str, str]]:
        """What the agent speaking after ``node`` reads: its system prompt, then the path's turns."""
        agent = self.speaker(node)
        messages = [{"role": "system", "content": self.system_prompts[agent]}]
        for i, n in enumerate(self.path(node)[1:]):
            own = self.agents[i % len(self.agents)] == agent
            role = "assistant" if self.generation.message_format == "code" or own else "user"
            messages.append({"role": role, "content": n.text})
        return messages

    def pair_candidates(
        self,
        theta_filter: float | None = None,
        theta_diff: float | None = None,
        *,
        minmax: Literal["exact", "code"] | None = None,
        train_capped_turns: bool = True,
    ) -> list[PairCandidate]:
        """Every pair the pair rule proposes, kept or not, with why it is dropped
        (:func:`optima_trainers.dpo.pairs.candidate_pairs`, which documents the rules); thresholds and
        ``minmax`` default to :attr:`search`'s."""
        return candidate_pairs(
            self, theta_filter, theta_diff, minmax=minmax, train_capped_turns=train_capped_turns
        )

    def pairs(
        self,
        theta_filter: float | None = None,
        theta_diff: float | None = None,
        *,
        minmax: Literal["exact", "code"] | None = None,
        train_capped_turns: bool = True,
    ) -> list[PreferencePair]:
        """The kept pairs of :meth:`pair_candidates` (same arguments), in creation order."""
        candidates = self.pair_candidates(
            theta_filter, theta_diff, minmax=minmax, train_capped_turns=train_capped_turns
        )
        return [c.pair for c in candidates if c.kept]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary: the instance, every node (with its parent id) and the selections."""
        return {
            "task_id": self.task_id,
            "sample_id": self.sample_id,
            "index": self.index,
            "split": self.split,
            "seed": self.seed,
            "nodes": [
                {
                    "id": n.id,
                    "parent": None if n.parent is None else n.parent.id,
                    "depth": n.depth,
                    "text": n.text,
                    "value": n.value,
                    "visits": n.visits,
                    "ended": n.ended,
                }
                for n in self.nodes
            ],
            "selected": [n.id for n in self.selected],
            "rewards": [t.reward for t in self.trajectories],
        }

    def __repr__(self) -> str:
        return (
            f"Tree(sample_id={self.sample_id!r}, nodes={len(self.nodes)}, "
            f"trajectories={len(self.trajectories)})"
        )
