"""The tree search's scheduling: every tree expands on its own in one shared generation batch
(:mod:`optima_trainers.tree.scheduler`), and the rollout engine's ``refill`` hook under it."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from optima_env import make_task
from optima_env.errors import TaskContractError
from optima_env.policy import GenerationRequest, SamplingParams, ScriptedPolicy, request_seed
from optima_env.rollout import RolloutError, RolloutJob, job_seed, make_jobs, rollout
from optima_env.types import Episode
from optima_trainers.config.env import EnvSettings
from optima_trainers.config.train import GenerationConfig, TreeSearchConfig
from optima_trainers.tree.search import Tree, build_trees
from tests.helpers import FailingAfter, TinyTask

LONG_TURN = "Alice: " + "word " * 40  # over the turn cap below: the episode ends after this turn


# -- (1) the batch stays full across trees ----------------------------------------------------------
def test_a_tree_selects_again_as_soon_as_its_rollouts_end_so_the_batch_stays_full() -> None:
    # Tree 0 (Ann) plays a short expansion (1 turn) then a long one (max_depth = 4 turns); tree 1
    # (Bo) the other way round. Each tree takes 1 + 4 = 5 generation steps, so with the two trees
    # in flight together every batch holds both expansions: 2 trees x 2 rollouts = 4 requests.
    # A round-synchronous search waits for the slowest rollout of each round: [4, 2, 2, 2] twice.
    asked: Counter[bool] = Counter()

    def reply(request: GenerationRequest) -> str:
        tree_zero = "Ann" in request.messages[0]["content"]
        asked[tree_zero] += 1
        first = asked[tree_zero] <= (2 if tree_zero else 8)  # the requests of the first expansion
        return LONG_TURN if tree_zero == first else "still thinking"

    policy = ScriptedPolicy(reply)
    scored: list[list[str]] = []

    def reward(episodes: Sequence[Episode]) -> list[float]:
        scored.append([e.sample_id for e in episodes])
        return [float(len(e.turns)) for e in episodes]

    trees = build_trees(
        TinyTask(),
        policy,
        [0, 1],
        reward_fn=reward,
        search=TreeSearchConfig(selections=2, rollouts=2), generation=GenerationConfig(max_turns=4),
        env=EnvSettings(extra={"turn_token_cap": 20}),
    )
    assert policy.calls == [4, 4, 4, 4, 4]
    # tree 0's first expansion ends at step 1, tree 1's at step 4, both second ones at step 5: the
    # two completed in the same step are scored in one reward_fn call
    assert scored == [["tiny-0"] * 2, ["tiny-1"] * 2, ["tiny-0"] * 2 + ["tiny-1"] * 2]
    for tree, lengths in zip(trees, ([1, 1, 4, 4], [4, 4, 1, 1])):
        assert [len(t.episode.turns) - t.start_depth for t in tree.trajectories] == lengths
        assert [t.step for t in tree.trajectories] == [0, 0, 1, 1] and len(tree.selected) == 2
    assert trees[0].trajectories[0].episode.end_reason == "turn_too_long"
    assert trees[0].trajectories[2].episode.end_reason == "max_turns"


def test_with_fewer_slots_than_rollouts_queued_trees_fill_the_freed_slots() -> None:
    # 4 trees x 2 rollouts, 4 slots: trees 2 and 3 wait in the queue and start as soon as trees 0
    # and 1's one-turn rollouts end; every step is full until fewer than 4 rollouts are left
    policy = ScriptedPolicy(lambda r: LONG_TURN if "Ann" in r.messages[0]["content"] else "hmm")
    trees = build_trees(
        TinyTask(),
        policy,
        [0, 1, 0, 1],
        keys=[0, 1, 2, 3],
        reward_fn=lambda eps: [0.0] * len(eps),
        search=TreeSearchConfig(selections=2, rollouts=2), generation=GenerationConfig(max_turns=3),
        env=EnvSettings(extra={"turn_token_cap": 20}),
        concurrency=4,
    )
    # generated turns: the short trees 2 expansions x 2 rollouts x 1 turn each; the long ones 3
    # turns from the root, then 2 from the depth-1 node they select: 2 x 2 x (1 + 1) + 2 x 2 x (3 + 2)
    generated = [len(t.episode.turns) - t.start_depth for tree in trees for t in tree.trajectories]
    assert sum(generated) == 28 and [t.start_depth for t in trees[1].trajectories] == [0, 0, 1, 1]
    assert policy.calls == [4] * 7


# -- (2) a tree does not depend on the other trees of the call ---------------------------------------
class KeyedScript:
    """A per-request seeded policy: each reply is a function of the request's seed
    (:func:`~optima_env.policy.request_seed` of the base seed and its key) and its prompt only."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        self.calls.append(len(requests))
        out = []
        for request in requests:
            rng = random.Random(request_seed(sampling.seed, request.key))
            name = request.messages[0]["content"].split()[-2]  # the instance: "Ann" or "Bo"
            choice = rng.choice(["<A>Paris</A>", "<A>Rome</A>", f"about {name}", "no idea"])
            out.append(f"{request.prefix} {choice} #{rng.randrange(3)}")
        return out


def test_a_tree_built_alone_equals_the_same_tree_built_with_others() -> None:
    search, generation = TreeSearchConfig(selections=3, rollouts=3, top_k=3), GenerationConfig(max_turns=5)

    def build(indices, keys, concurrency=None) -> tuple[list[Tree], KeyedScript]:
        policy = KeyedScript()
        trees = build_trees(TinyTask(), policy, indices, keys=keys, seed=7, concurrency=concurrency,
                            reward_fn=lambda eps: [len(e.turns) / 5 for e in eps], search=search, generation=generation)  # fmt: skip
        return trees, policy

    (alone,), alone_policy = build([0], [0])
    together, together_policy = build([1, 0, 0], [4, 0, 9])
    squeezed, squeezed_policy = build([0, 1], [0, 4], concurrency=2)
    for other in (together[1], squeezed[0]):
        assert other.to_dict() == alone.to_dict()
        assert [t.episode for t in other.trajectories] == [t.episode for t in alone.trajectories]
    assert together[0].to_dict() == squeezed[1].to_dict()
    # the batches were composed differently, and the search is not trivial
    assert alone_policy.calls != together_policy.calls != squeezed_policy.calls
    assert max(squeezed_policy.calls) == 2
    assert len({len(t.episode.turns) for t in alone.trajectories}) > 1 and len(alone.nodes) > 6
    # another key is another tree (seeds and sampling keys differ), and the same call repeats exactly
    assert together[2].to_dict() != alone.to_dict()
    again, _ = build([1, 0, 0], [4, 0, 9])
    assert [t.to_dict() for t in again] == [t.to_dict() for t in together]


# -- (3) rollout's refill hook ------------------------------------------------------------------------
def keyed_reply(request: GenerationRequest) -> str:
    """A function of the request's identity (seed, turn) and content, like a seeded sampler."""
    seed, turn = request.key
    if (seed + turn) % 3 == 0 and turn > 0:
        return f"<A>{request.messages[-1]['content'][-12:]}</A>"
    return f"turn {turn} seed {seed % 97}"


def test_refill_jobs_are_played_in_the_same_loop_and_returned_after_the_given_ones() -> None:
    task = make_task("ie/synth-v0")
    jobs = make_jobs(range(3), num_samples=1, seed=5)
    calls: list[list[int]] = []
    added: list[RolloutJob] = []
    reported: list[int] = []

    def refill(ended: Sequence[tuple[int, Episode]]) -> list[RolloutJob]:
        calls.append([pos for pos, _ in ended])
        new = [
            RolloutJob(index=pos + 3, sample=0, seed=job_seed(5, pos + 3, 0)) for pos, _ in ended if pos < 3
        ]
        added.extend(new)
        return new

    policy = ScriptedPolicy(keyed_reply)
    kwargs = {"env_kwargs": {"max_turns": 6}, "concurrency": 3}
    episodes = rollout(task, policy, jobs=jobs, refill=refill, on_episode=lambda p, e: reported.append(p),
                       **kwargs)  # fmt: skip
    assert len(added) == 3 and len(episodes) == 6
    # the given jobs first, then the refilled ones in the order they were returned
    assert episodes == rollout(task, ScriptedPolicy(keyed_reply), jobs=jobs + added, **kwargs)
    assert [e.sample_id for e in episodes[3:]] == [task.samples("train")[j.index].id for j in added]
    assert sorted(reported) == list(range(6)) and all(c == sorted(c) for c in calls)
    assert sorted(p for c in calls for p in c) == list(range(6))
    # each refilled job joins the batch at the next step: full while at least 3 jobs remain
    assert sum(policy.calls) == sum(len(e.turns) for e in episodes)
    assert policy.calls[0] == 3 and max(policy.calls) == 3


def test_without_refill_or_with_an_empty_one_the_rollout_is_unchanged() -> None:
    task = make_task("ie/synth-v0")
    jobs = make_jobs(range(4), num_samples=2, seed=1)
    plain_policy, empty_policy = ScriptedPolicy(keyed_reply), ScriptedPolicy(keyed_reply)
    plain = rollout(task, plain_policy, jobs=jobs, concurrency=3, env_kwargs={"max_turns": 5})
    empty = rollout(task, empty_policy, jobs=jobs, concurrency=3, env_kwargs={"max_turns": 5},
                    refill=lambda ended: [])  # fmt: skip
    assert plain == empty and plain_policy.calls == empty_policy.calls
    with pytest.raises(TaskContractError, match="refill must return"):
        rollout(task, ScriptedPolicy(keyed_reply), jobs=jobs, refill=lambda ended: [None])


def test_a_failure_after_a_refill_lists_the_refilled_jobs_to_resume() -> None:
    task = make_task("ie/synth-v0")
    jobs = make_jobs(range(2), num_samples=1, seed=3)
    follow = make_jobs(range(2, 4), num_samples=1, seed=3)

    def refill(ended: Sequence[tuple[int, Episode]]) -> list[RolloutJob]:
        return [follow[pos] for pos, _ in ended if pos < 2]

    # "<A>Paris</A>" twice ends an episode after 2 turns: jobs 0-1 end at call 2, their follow-ups
    # start at call 3, and call 3 fails
    with pytest.raises(RolloutError, match="2 of 4 episodes had finished") as info:
        rollout(task, FailingAfter(3), jobs=jobs, refill=refill)
    err = info.value
    assert err.jobs == jobs + follow and err.pending == [2, 3] and sorted(err.finished) == [0, 1]
    paris = ScriptedPolicy(lambda r: "<A>Paris</A>")
    resumed = rollout(task, paris, jobs=[err.jobs[i] for i in err.pending])
    assert err.episodes + resumed == rollout(task, paris, jobs=jobs + follow)


@pytest.mark.parametrize(("concurrency", "capacity"), [(2, None), (None, 2)])
def test_trees_end_one_after_another_under_a_bounded_batch_and_equal_those_grown_all_at_once(
    concurrency, capacity
) -> None:
    """With every tree started at once the first-in first-out queue grew them in lockstep, and all
    of them ended at the very end of the stage (nothing saved by a stage cut short). The bound holds
    under the caller's concurrency, and without one under the engine's capacity (a trainer's run
    leaves its concurrency to the engine)."""
    from optima_env.rollout import DEFAULT_CONCURRENCY, resolve_concurrency
    from optima_trainers.tree.scheduler import trees_in_flight

    search, generation = TreeSearchConfig(selections=3, rollouts=2, top_k=3), GenerationConfig(max_turns=5)
    indices, keys = [0, 1] * 5, list(range(10))
    ended: list[int] = []
    seen: set[object] = set()  # the tree seeds the policy has been asked for so far
    started_when_first_ended: list[int] = []

    class Recording(KeyedScript):
        def __init__(self) -> None:
            super().__init__()
            self.capacity = capacity  # the batch slots an engine declares (None: none)

        def generate(self, requests, sampling):
            seen.update(r.key[0] for r in requests)
            return super().generate(requests, sampling)

    def on_tree(position: int, tree: Tree) -> None:
        ended.append(position)
        if len(ended) == 1:
            started_when_first_ended.append(len(seen))

    bounded = build_trees(TinyTask(), Recording(), indices, keys=keys, seed=7, concurrency=concurrency,
                          search=search, generation=generation, on_tree=on_tree,
                          reward_fn=lambda eps: [len(e.turns) / 5 for e in eps])  # fmt: skip
    assert trees_in_flight(2, 2) == 2 and sorted(ended) == list(range(10)) and len(seen) == 10
    # at most 2 trees grow at once: the first tree ended before a third one started
    assert started_when_first_ended == [2]
    assert resolve_concurrency(Recording(), concurrency) == 2
    assert resolve_concurrency(KeyedScript()) == DEFAULT_CONCURRENCY
    free = build_trees(TinyTask(), KeyedScript(), indices, keys=keys, seed=7, search=search,
                       generation=generation, reward_fn=lambda eps: [len(e.turns) / 5 for e in eps])  # fmt: skip
    assert [t.to_dict() for t in bounded] == [t.to_dict() for t in free]
