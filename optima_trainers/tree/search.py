"""MCTS-style data generation for iDPO (spec §6.2, §6.3).

For every instance a :class:`~optima_trainers.tree.nodes.Tree` of turns is grown by
``tree.selections`` expansions of (settings: :class:`~optima_trainers.config.train.TreeSearchConfig`):

1. **select** a node: the candidates are the root and every node whose first child itself has
   children; a candidate whose text is within ``ed(a, b) / (max(|a|, |b|) + 1) < 0.25`` of any
   previously selected node is dropped (so a selected node is never selected again); the rest are
   sorted by value, the top 10 kept and one sampled with probability ∝ exp(value); the root when
   nothing is left;
2. **simulate** ``tree.rollouts`` conversations from it at temperature 0.7, to the end of
   the conversation (spec §2.4) or ``generation.max_turns`` turns (the env truncates there; such a rollout's
   final answer is ``"error"``, scored by the task, as the reference's depth cut:
   ``depth_cut="error"``; ``"last_answer"`` keeps the current answer);
3. **insert** each rollout into the tree (a turn within ``ed / (len(new) + 1) < 0.1`` of an existing
   child is merged into that child) and **back-propagate** its reward as running means.

Generation is batched across trees, and each tree advances on its own
(:mod:`optima_trainers.tree.scheduler`): the rollouts of every tree's current expansion share one
:func:`optima_env.rollout.rollout` loop, each env replaying its node's path with
``reset(options={"index": i, "prefix": [...]})``; as soon as a tree's rollouts have all ended they
are scored (with those of the other trees that completed in the same step) and inserted, and the
tree's next selection joins the batch without waiting for the other trees. A tree's result does
not depend on the other trees: its rng, env seed and sampling keys are its own. Every rollout of a
tree uses the same env seed, so every rollout sees the same dealing of evidence. The turn right
after the selected node is generated with the speaking agent's own system prompt, also when the
critic speaks (the reference code uses the solver's there; spec §13 item 9).

Where this differs from the reference code (documented deviations):

* the current answer after a replayed prefix follows the env's rule (the last answer-bearing turn
  on the path), where the reference parsed only the selected node's own turn;
* a node whose path of texts already ended, or that hangs below such a node (both possible only
  through a merged sibling variant), is not a selection candidate (replaying it would end the
  conversation at once, or before the node);
* none by default in the pairs: the reference's incremental min/max-child tracking
  (``minmax="code"``) can go stale as running means drift; ``minmax="exact"`` recomputes them.

Candidates the similarity filter drops are removed for good, as the reference deletes them from its
node list: never a candidate again, and never a pair parent unless they were selected
(``filtered_parents="drop"``). The paper's variants (spec §13): ``edit_distance="max_length"``
(item 8) and ``pair_rule="shared_ancestor"`` (item 7); with ``EpisodeScorer(normalizer="running")`` the
token normalizer is the per-instance max (item 3).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from optima_env.errors import ScoringError, TaskContractError
from optima_env.policy import ChatPolicy
from optima_env.rollout import job_seed
from optima_env.rules import checked_score
from optima_env.task import Task
from optima_env.types import Episode
from optima_trainers.config.env import EnvSettings
from optima_trainers.config.sections import GenerationConfig
from optima_trainers.config.tree import TreeSearchConfig
from optima_trainers.sft.selection import draw_sample_id
from optima_trainers.tree.nodes import Node, Tree, TreeTrajectory, normalized_edit_distance
from optima_trainers.tree.normalizer import estimate_token_normalizer
from optima_trainers.tree.scheduler import Expansion, ExpansionScheduler

__all__ = [
    "Node",
    "Tree",
    "TreeSearchConfig",
    "TreeTrajectory",
    "build_trees",
    "estimate_token_normalizer",
    "select_node",
]

DEPTH_CUT_ANSWER = "error"
"""The final answer of a tree rollout cut at the depth limit without agreement (reference code)."""

RewardFn = Callable[[Sequence[Episode]], Sequence[float] | Sequence[Episode]]
"""Scores a batch of finished episodes: one float each, or the episodes with ``reward`` filled in."""


def _far(node: Node, selected: Node, config: TreeSearchConfig) -> bool:
    distance = normalized_edit_distance(node.text, selected.text, form=config.edit_distance)
    return distance >= config.select_edit_threshold


def select_node(tree: Tree, config: TreeSearchConfig, rng: random.Random) -> Node:
    """Choose the node to simulate from (step 1 of the search) and record it as selected.

    Candidates too close to a previously selected node are removed from the tree's candidates for
    good (``tree.removed``), as the reference deletes them from its node list.
    """
    candidates = []
    for n in tree.candidates():
        if n.id in tree.removed:
            continue
        if all(_far(n, s, config) for s in tree.selected):
            candidates.append(n)
        else:
            tree.removed.add(n.id)
    if not candidates:
        chosen = tree.root
    else:
        top = sorted(candidates, key=lambda n: n.value, reverse=True)[: config.top_k]  # stable sort
        peak = max(n.value for n in top)
        weights = [math.exp(n.value - peak) for n in top]  # softmax, shifted for stability
        threshold = rng.random() * sum(weights)
        chosen, acc = top[-1], 0.0
        for node, weight in zip(top, weights):
            acc += weight
            if acc >= threshold:
                chosen = node
                break
    tree.selected.append(chosen)
    return chosen


# size: the public tree-search API: instances, reward, the two config sections, keyword options with defaults
def build_trees(
    task: Task,
    policy: ChatPolicy,
    instance_indices: Sequence[int],
    *,
    reward_fn: RewardFn,
    split: str = "train",
    env: EnvSettings | None = None,
    seed: int = 0,
    search: TreeSearchConfig | None = None,
    generation: GenerationConfig | None = None,
    keys: Sequence[int] | None = None,
    concurrency: int | None = None,
    driver: str = "auto",
    on_tree: Callable[[int, Tree], None] | None = None,
    progress: bool = False,
) -> list[Tree]:
    """Grow one search tree per instance; the rollouts of all trees share one generation batch,
    and each tree selects its next node as soon as its last rollouts have ended.

    Args:
        task: the task to play.
        policy: the current model (any :class:`~optima_env.policy.ChatPolicy`).
        instance_indices: positions of the instances in ``split`` (one tree each).
        reward_fn: scores finished episodes: one float each, or the scored episodes, which the
            trees then keep (e.g. ``EpisodeScorer(config.tree_reward, normalizer=...).score``,
            :class:`~optima_env.episode_scorer.EpisodeScorer`).
        split: the data split.
        env: the env settings (default: ``EnvSettings()``, the env's own: the tokenizer, the
            plugin manager, further ConversationEnv options such as ``turn_token_cap``).
        seed: seeds the evidence dealing, the node selection and the sampling (each request's key is
            ``(tree seed, selection step, rollout number, turn)``).
        search: the tree-search settings (default: ``TreeSearchConfig()``, the ``code`` preset's,
            as the trainer's ``tree`` section; one declaration, no copy).
        generation: the conversation settings (default: ``GenerationConfig()``, as the trainer's
            ``generation`` section): the rollouts sample with its ``temperature``, ``top_p`` and
            ``max_new_tokens``, stop at the agents' tags when ``stop_at_speaker_tags``, and end at
            ``max_turns`` (the depth limit) or by its ``termination`` rule, in its
            ``message_format`` (:meth:`EnvSettings.kwargs`).
        keys: per-tree identity the tree's seeds derive from (default: the instance index); pass
            distinct keys (e.g. the instance cursor position) when an instance appears twice.
        concurrency: conversations in flight (``None``, the default: the engine's ``capacity``,
            else :data:`optima_env.rollout.DEFAULT_CONCURRENCY`).
        driver: the rollout driver (:data:`optima_env.turns.DRIVERS`; ``generation.driver``).
        on_tree: called with ``(position, tree)`` as soon as a tree has all its selections (the
            others still growing), e.g. to save it; the trees completed in one step in order.
        progress: show a progress bar over the selections of all trees.

    Returns:
        The trees, in the order of ``instance_indices``.
    """
    search = search if search is not None else TreeSearchConfig()
    generation = generation if generation is not None else GenerationConfig()
    env = env if env is not None else EnvSettings()
    keys = list(instance_indices) if keys is None else list(keys)
    if len(keys) != len(instance_indices):
        raise TaskContractError(
            f"got {len(keys)} keys for {len(instance_indices)} instances; give one key per tree"
        )
    samples = task.samples(split)
    trees, rngs = [], []
    for index, key in zip(instance_indices, keys):
        if not isinstance(index, int) or not 0 <= index < len(samples):
            raise TaskContractError(f"instance index must be an int in [0, {len(samples)}), got {index!r}")
        trees.append(
            Tree(
                task_id=task.id,
                sample_id=draw_sample_id(samples[index].id, key, len(samples)),
                index=index,
                split=split,
                seed=job_seed(seed, key, 0),
                agents=tuple(task.agents),
                system_prompts={},
                search=search,
                generation=generation,
            )
        )
        rngs.append(random.Random(f"optima-mcts-select/{seed}/{key}"))
    if not trees:
        return []
    tokenizer = env.tokenizer

    def finish(expansions: list[Expansion]) -> None:
        """Score the completed expansions in one ``reward_fn`` call, then insert each rollout."""
        played = [
            _as_drawn(task, e, trees[x.tree], samples, search, tokenizer)
            for x in expansions
            for e in x.episodes
            if e is not None
        ]
        episodes, rewards = _rewards(reward_fn, played)
        n = search.rollouts
        for i, x in enumerate(expansions):
            tree = trees[x.tree]
            for episode, reward in zip(episodes[i * n : (i + 1) * n], rewards[i * n : (i + 1) * n]):
                _check_prompts(tree, episode)
                tree.insert(episode, x.start, reward, step=x.step)

    ExpansionScheduler(
        trees,
        rollouts=search.rollouts,
        selections=search.selections,
        select=lambda t: select_node(trees[t], search, rngs[t]),
        finish=finish,
        on_tree=None if on_tree is None else (lambda t: on_tree(t, trees[t])),
    ).run(
        task,
        policy,
        sampling=generation.sampling(task.agents, seed=seed),
        concurrency=concurrency,
        env_kwargs=env.kwargs(generation, split=split),
        progress=progress,
        driver=driver,
    )
    return trees


def _as_drawn(
    task: Task, episode: Episode, tree: Tree, samples: Sequence[Any], config: TreeSearchConfig, tokenizer: Any
) -> Episode:
    """The rollout as its tree records it: the tree's sample id (one per draw), and under
    ``depth_cut="error"`` a rollout cut at the depth limit gets the final answer ``"error"``, scored
    by the task (the reference back-propagates ``"error"`` there)."""
    if episode.sample_id != tree.sample_id:
        episode = replace(episode, sample_id=tree.sample_id)
    if config.depth_cut == "error" and episode.end_reason == "max_turns":
        sample = samples[tree.index]
        episode = replace(
            episode,
            final_answer=DEPTH_CUT_ANSWER,
            task_score=checked_score(task, DEPTH_CUT_ANSWER, sample, tokenizer=tokenizer),
            metadata={**episode.metadata, "depth_cut": True},
        )
    return episode


def _rewards(reward_fn: RewardFn, episodes: list[Episode]) -> tuple[list[Episode], list[float]]:
    """Run ``reward_fn``; scored episodes it returns replace the played ones (their total is the reward)."""
    out = list(reward_fn(episodes))
    if len(out) != len(episodes):
        raise ScoringError(
            f"reward_fn returned {len(out)} values for {len(episodes)} episodes; it must give one each"
        )
    rewards = []
    for i, item in enumerate(out):
        if isinstance(item, Episode):
            if item.reward is None:
                raise ScoringError("reward_fn returned an episode without a reward; fill episode.reward")
            episodes[i], item = item, item.reward.total
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item):
            raise ScoringError(f"reward_fn must give a finite float (or a scored Episode), got {item!r}")
        rewards.append(float(item))
    return episodes, rewards


def _check_prompts(tree: Tree, episode: Episode) -> None:
    """Every rollout of a tree must see the same prompts (same seed, same instance)."""
    prompts = dict(episode.base_system_prompts)
    if not tree.system_prompts:
        tree.system_prompts = prompts
    elif prompts != tree.system_prompts:
        raise TaskContractError(
            f"tree {tree.sample_id}: two rollouts with the same seed got different system prompts; the "
            f"task's views() must be a function of (sample, rng) only"
        )
