"""The scheduler under :func:`optima_trainers.tree.search.build_trees`: every tree expands on its own.

One *expansion* is a tree's selected node and the ``rollouts_per_selection`` conversations played
from it. A tree's next selection needs the values its last expansion back-propagated, so a tree
has one expansion in flight at a time; the trees, though, need not wait for each other. All the
expansions in flight share one :func:`optima_env.rollout.rollout` loop: after every generation step,
its ``refill`` hook hands over the episodes that ended, and every expansion whose rollouts have all
ended is finished (scored together with the others that completed in that step, so a batched
scorer such as the readability model sees them at once, then inserted), its tree selects again,
and the new rollouts join the batch at the next step. A tree's short conversations do not wait for
another tree's long ones, so the batch does not drain between selections as a round-synchronous
search (every tree waiting for the slowest rollout of the round) does. What cannot overlap: a
tree's next expansion waits for all of its current rollouts, so a slot freed by a tree's short
rollout stays empty until its siblings end, unless queued work of other trees takes it (with
``concurrency`` below ``trees x rollouts``, the trees beyond it wait in the queue and do). The
conversations in flight are sized from the engine's ``capacity`` unless ``concurrency`` says
otherwise, and a tree whose last expansion is finished is handed to ``on_tree`` at once (a tree
stage saves it there), while the other trees go on: nothing drains between trees. At most
:func:`trees_in_flight` trees grow at once, and the next tree starts as one ends, so trees end (and
are saved) steadily through a stage, not all at its end.

It is written by hand because no library schedules multi-turn tree expansions: batched inference
engines (vLLM's continuous batching, ...) schedule independent requests, and tree-search libraries
expand one node at a time against a single-step simulator, while here one expansion is several
multi-turn conversations whose every turn joins a shared batch, and what runs next depends on how
they scored.

Determinism: a tree's result depends on its own inputs only, never on the other trees of the call
or on how the batch was composed. Its selection rng is its own, its expansions are finished in
order, and the sampling key of each request is ``(tree seed, selection step, rollout number,
turn)`` (seeded backends derive the request's seed from it, see
:func:`optima_env.policy.request_seed`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optima_env.policy import ChatPolicy, SamplingParams
from optima_env.rollout import RolloutJob, resolve_concurrency, rollout
from optima_env.task import Task
from optima_env.types import Episode
from optima_trainers.tree.nodes import Node, Tree

__all__ = ["Expansion", "ExpansionScheduler", "trees_in_flight"]


def trees_in_flight(concurrency: int, rollouts: int) -> int:
    """How many trees grow at once under ``concurrency`` conversations in flight: twice the trees
    whose current expansions fill the batch (each has ``rollouts`` conversations in flight at most,
    and none while its expansion waits for its slowest rollout, hence the factor of 2).

    Why a bound: the rollout queue is first in, first out, so with every tree started at once each
    tree's next expansion queued behind every other tree's current one, the trees grew in lockstep
    and all of them ended together at the very end of the stage; a stage cut short then had saved no
    tree. With a bound, trees end one after another from early on, and each is saved as it ends.

    >>> trees_in_flight(32, 3), trees_in_flight(1, 3)
    (22, 2)
    """
    return 2 * max(1, -(-concurrency // rollouts))


@dataclass(slots=True)
class Expansion:
    """One selection of one tree and its rollouts (their episodes fill in as they end)."""

    tree: int
    """Position of the tree in the call."""
    step: int
    """The tree's selection step (0-based)."""
    start: Node
    """The selected node the rollouts continue."""
    prefix: list[str]
    """The texts of ``start``'s path, replayed by every rollout."""
    episodes: list[Episode | None]
    """The played episodes by rollout number (``None`` while it runs)."""

    @property
    def done(self) -> bool:
        """Whether every rollout has ended."""
        return all(e is not None for e in self.episodes)


class ExpansionScheduler:
    """Runs ``selections`` expansions of every tree through one rollout loop (see module docstring).

    Args:
        trees: the trees to grow.
        rollouts: conversations per expansion (``rollouts_per_selection``).
        selections: expansions per tree (``num_selections``).
        select: picks (and records) the next node of tree ``t``.
        finish: scores and inserts a batch of completed expansions (in tree order).
        on_tree: called with a tree's position once its last expansion is finished (after
            ``finish``; the trees completed in one step in tree order).
    """

    def __init__(
        self,
        trees: Sequence[Tree],
        *,
        rollouts: int,
        selections: int,
        select: Callable[[int], Node],
        finish: Callable[[list[Expansion]], None],
        on_tree: Callable[[int], None] | None = None,
    ) -> None:
        self.trees = list(trees)
        self.rollouts = rollouts
        self.selections = selections
        self.select = select
        self.finish = finish
        self.on_tree = on_tree
        self.steps = [0] * len(self.trees)
        """Expansions started per tree."""
        self.jobs: list[RolloutJob] = []
        """Every job by rollout position (the order :func:`~optima_env.rollout.rollout` numbers them)."""
        self._slots: dict[RolloutJob, tuple[Expansion, int]] = {}
        self._bar: Any = None
        self._open = 0
        """Trees started so far (in tree order); the others wait until a started tree ends."""

    def run(
        self,
        task: Task,
        policy: ChatPolicy,
        *,
        sampling: SamplingParams,
        concurrency: int | None,
        env_kwargs: Mapping[str, Any],
        progress: bool = False,
        driver: str = "auto",
    ) -> None:
        """Grow every tree to ``selections`` expansions; ``concurrency`` episodes in flight at most
        (``None``: the engine's ``capacity``, else the rollout's default; see
        :func:`optima_env.rollout.rollout`, which also takes ``driver``)."""
        bound = trees_in_flight(resolve_concurrency(policy, concurrency, driver), self.rollouts)
        self._open = min(len(self.trees), bound)
        first = [job for t in range(self._open) for job in self._expand(t)]
        if not first:
            return
        if progress:
            from tqdm.auto import tqdm

            total = len(self.trees) * self.selections
            self._bar = tqdm(total=total, desc=f"mcts {task.id} ({len(self.trees)} trees)", unit="selection")
        try:
            rollout(
                task,
                policy,
                jobs=first,
                sampling=sampling,
                concurrency=concurrency,
                driver=driver,
                env_kwargs=env_kwargs,
                reset_options=self.reset_options,
                request_key=self.request_key,
                refill=self.refill,
            )
        finally:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def _expand(self, t: int) -> list[RolloutJob]:
        """Select tree ``t``'s next node; the jobs of its rollouts (none when its selections are spent)."""
        step = self.steps[t]
        if step >= self.selections:
            return []
        self.steps[t] += 1
        tree = self.trees[t]
        start = self.select(t)
        expansion = Expansion(
            tree=t, step=step, start=start, prefix=tree.prefix(start), episodes=[None] * self.rollouts
        )
        jobs = []
        for r in range(self.rollouts):
            # ``sample`` numbers the rollout within the call (unique: the jobs key the lookup); every
            # rollout of a tree shares its env seed, so every one sees the same evidence
            sample = (t * self.selections + step) * self.rollouts + r
            job = RolloutJob(index=tree.index, sample=sample, seed=tree.seed)
            self._slots[job] = (expansion, r)
            jobs.append(job)
        self.jobs.extend(jobs)
        return jobs

    def reset_options(self, job: RolloutJob) -> dict[str, Any]:
        """The env replays the path of the job's own selected node."""
        expansion, _ = self._slots[job]
        return {"index": job.index, "prefix": expansion.prefix}

    def request_key(self, job: RolloutJob, turn: int) -> tuple[object, ...]:
        """``(tree seed, selection step, rollout number, turn)``: the rollouts of one node share the
        env seed, so the key must tell them apart (or a per-request-seeded backend would sample the
        same text for each), and it must not depend on the other trees."""
        expansion, r = self._slots[job]
        return (job.seed, expansion.step, r, turn)

    def refill(self, ended: Sequence[tuple[int, Episode]]) -> list[RolloutJob]:
        """Record the episodes that ended; finish the completed expansions; start their trees' next."""
        completed: list[Expansion] = []
        for pos, episode in ended:
            expansion, r = self._slots.pop(self.jobs[pos])
            expansion.episodes[r] = episode
            if expansion.done:
                completed.append(expansion)
        if not completed:
            return []
        completed.sort(key=lambda x: x.tree)
        self.finish(completed)
        if self._bar is not None:
            self._bar.update(len(completed))
        ended = [x.tree for x in completed if x.step == self.selections - 1]
        if self.on_tree is not None:
            for t in ended:
                self.on_tree(t)
        jobs = [job for x in completed for job in self._expand(x.tree)]
        for _ in ended:  # each tree that ended makes room for the next one
            if self._open < len(self.trees):
                jobs += self._expand(self._open)
                self._open += 1
        return jobs
