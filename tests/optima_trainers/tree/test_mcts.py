"""MCTS tree search with scripted policies and known rewards: values, merges, selection, pairs."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import pytest
from optima_task_synth import SyntheticChainTask

from optima_env import ConversationEnv
from optima_env.configtree import ConfigError
from optima_env.episode_scorer import EpisodeScorer
from optima_env.errors import ScoringError, TaskContractError
from optima_env.policy import GenerationRequest, ScriptedPolicy
from optima_env.reward import RewardConfig, score_episode
from optima_env.rollout import run_episode
from optima_env.types import Episode
from optima_trainers.config.env import EnvSettings
from optima_trainers.config.train import GenerationConfig, TreeSearchConfig
from optima_trainers.dpo.pairs import select_top_pairs
from optima_trainers.tree.nodes import normalized_edit_distance
from optima_trainers.tree.search import Tree, build_trees, select_node
from tests.helpers import TinyTask

# -- a scripted conversation: replies are a function of (speaker's prompt, path) and a call counter --
A1 = "Alice: Ann is in the north."
A1_VARIANT = "Alice: Ann is in the north!"  # 1 edit from A1: merged into A1's node
A2 = "Alice: I have no facts at all today."
B_PARIS = "Bob: North city is Paris. <A>Paris</A>"
B_ROME = "Bob: Maybe <A>Rome</A>"
B_LYON = "Bob: I think <A>Lyon</A>"
SCRIPT = {
    (): [A1, A2, A1_VARIANT],
    (A1,): [B_PARIS, B_ROME, B_LYON, B_PARIS],
    (A1_VARIANT,): [B_PARIS],
    (A2,): ["Bob: Then <A>Rome</A>"],
    (A1, B_LYON): ["Alice: hmm"],
}
REWARD_BY_ANSWER = {"Paris": 1.0, "Rome": 0.0, "Lyon": 0.5, "error": 0.25, None: -1.0}
"""``error``: the final answer of a rollout cut at the depth limit (the reference's depth cut)."""


class CountingScript:
    """Replies from SCRIPT, cycling per (system prompt, path); otherwise echo the last answer."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, tuple[str, ...]]] = Counter()

    def __call__(self, request: GenerationRequest) -> str:
        path = tuple(m["content"] for m in request.messages[1:])
        key = (request.messages[0]["content"], path)
        options = SCRIPT.get(path)
        if options:
            reply = options[self.counts[key] % len(options)]
            self.counts[key] += 1
            return reply
        last = path[-1] if path else ""
        return f"<A>{last.split('<A>')[1].split('</A>')[0]}</A>" if "<A>" in last else "not sure"


def answer_reward(episodes: Sequence[Episode]) -> list[float]:
    return [REWARD_BY_ANSWER[e.final_answer] for e in episodes]


def scripted_trees(indices=(0,), **overrides) -> tuple[list[Tree], ScriptedPolicy]:
    policy = ScriptedPolicy(CountingScript())
    search = TreeSearchConfig(**{"selections": 2, "top_k": 1, **overrides})
    trees = build_trees(TinyTask(), policy, list(indices), reward_fn=answer_reward, search=search,
                        generation=GenerationConfig(max_turns=4))  # fmt: skip
    return trees, policy


def node(tree: Tree, *texts: str):
    current = tree.root
    for text in texts:
        (current,) = [c for c in current.children if c.text == text]
    return current


def test_tree_values_are_means_of_backpropagated_rewards() -> None:
    (tree,), _ = scripted_trees()
    # round 0 from the root: A1→B_PARIS→agree (1.0), A2→Rome→agree (0.0), A1_VARIANT merged (1.0);
    # round 1 from A1 (top_k=1: the best candidate): B_ROME (0.0), B_LYON→hmm→cut at depth 4 with
    # no agreement: final answer "error" (0.25, not Lyon's 0.5), B_PARIS again (1.0)
    assert tree.root.visits == 6 and tree.root.value == pytest.approx(3.25 / 6)
    assert [round(c.value, 6) for c in tree.root.children] == [0.65, 0.0]
    assert node(tree, A1).visits == 5
    assert [(c.text, c.visits, c.value) for c in node(tree, A1).children] == [
        (B_PARIS, 3, 1.0),
        (B_ROME, 1, 0.0),
        (B_LYON, 1, 0.25),
    ]
    assert node(tree, A1, B_LYON, "Alice: hmm", "Bob: not sure").value == 0.25
    assert sorted(t.reward for t in tree.trajectories) == [0.0, 0.0, 0.25, 1.0, 1.0, 1.0]
    (cut,) = [t.episode for t in tree.trajectories if t.episode.end_reason == "max_turns"]
    assert cut.final_answer == "error" and cut.task_score == 0.0 and cut.metadata["depth_cut"]
    assert [n.text for n in tree.selected] == ["", A1]
    assert len(tree.nodes) == 12  # root + 11 distinct turns
    # the depth-4 leaf and the agreeing turns end their paths
    assert node(tree, A1, B_LYON, "Alice: hmm", "Bob: not sure").ended
    assert node(tree, A1, B_PARIS, "Alice: <A>Paris</A>").ended
    assert not node(tree, A1, B_LYON).ended


def test_every_round_is_one_batch_across_trees() -> None:
    (single,), _ = scripted_trees((0,))
    both, policy = scripted_trees((0, 1))
    # 2 trees x 3 rollouts start together; the first call of each round holds all 6
    assert policy.calls[0] == 6 and max(policy.calls) == 6
    assert [(n.text, n.value, n.visits) for n in both[0].nodes] == [
        (n.text, n.value, n.visits) for n in single.nodes
    ]
    assert both[1].sample_id == "tiny-1" and both[1].system_prompts["Alice"] == "You are Alice."
    assert {t.episode.seed for t in both[0].trajectories} == {both[0].seed} != {both[1].seed}


def test_pairs_one_per_parent_best_against_worst_with_thresholds() -> None:
    (tree,), _ = scripted_trees()
    pairs = tree.pairs(theta_filter=0.4, theta_diff=0.2)
    assert [(p.depth, p.agent, p.chosen, p.rejected) for p in pairs] == [
        (0, "Alice", A1, A2),  # root: 0.65 vs 0.0
        (1, "Bob", B_PARIS, B_ROME),  # A1: 1.0 vs 0.0 (B_LYON, 0.25, is neither)
    ]
    root_pair, a1_pair = pairs
    assert root_pair.prompt == ({"role": "system", "content": "You are Alice."},)
    assert a1_pair.prompt == (
        {"role": "system", "content": "You are Bob."},
        {"role": "assistant", "content": A1},
    )
    assert (a1_pair.chosen_value, a1_pair.rejected_value) == (1.0, 0.0)
    assert root_pair.chosen_value == pytest.approx(0.65) and root_pair.sample_id == "tiny-0"
    # θ_filter is strict on the chosen value, θ_diff on the gap
    assert [p.depth for p in tree.pairs(theta_filter=0.66, theta_diff=0.2)] == [1]
    assert [p.depth for p in tree.pairs(theta_filter=0.64, theta_diff=0.2)] == [0, 1]
    assert [p.depth for p in tree.pairs(theta_filter=0.4, theta_diff=0.66)] == [1]
    assert [p.depth for p in tree.pairs(theta_filter=0.4, theta_diff=0.64)] == [0, 1]
    assert tree.pairs(theta_filter=1.0, theta_diff=0.0) == []
    # top 50% per tree by chosen value
    assert select_top_pairs([pairs]) == [a1_pair]


def test_rollouts_of_one_node_get_distinct_sampling_keys() -> None:
    keys: list[tuple[object, ...]] = []
    script = CountingScript()

    def reply(request: GenerationRequest) -> str:
        keys.append(request.key)
        return script(request)

    (tree,) = build_trees(
        TinyTask(),
        ScriptedPolicy(reply),
        [0],
        reward_fn=answer_reward,
        search=TreeSearchConfig(selections=2, top_k=1), generation=GenerationConfig(max_turns=4),
    )
    # seeded backends derive each request's seed from its key: equal keys would mean equal samples
    first_turn = keys[:3]
    assert len(set(first_turn)) == 3 and {k[0] for k in first_turn} == {tree.seed}


def test_a_seeded_model_backend_samples_distinct_rollouts_from_one_node() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from optima_env.backends.hf import TransformersPolicy
    from optima_env.models import resolve_model_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_model_path("embedded"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
    )  # fmt: skip
    policy = TransformersPolicy(transformers.LlamaForCausalLM(config).eval(), tokenizer)
    (tree,) = build_trees(
        TinyTask(),
        policy,
        [0],
        reward_fn=lambda eps: [0.0] * len(eps),
        search=TreeSearchConfig(selections=1), generation=GenerationConfig(max_turns=1, max_new_tokens=8),
        env=EnvSettings(tokenizer=tokenizer),
    )
    # three samples of a random model from the same prompt: three children, nothing merged
    assert len(tree.root.children) == 3 and len({c.text for c in tree.root.children}) == 3


def test_alternating_message_format_in_pair_prompts() -> None:
    policy = ScriptedPolicy(CountingScript())
    (tree,) = build_trees(
        TinyTask(),
        policy,
        [0],
        reward_fn=answer_reward,
        search=TreeSearchConfig(selections=2, top_k=1),
        generation=GenerationConfig(max_turns=4, message_format="alternating"),
    )
    # the script keys on the path, which is the same text under both formats
    (pair,) = [p for p in tree.pairs(0.4, 0.2) if p.depth == 1]
    assert pair.prompt[1] == {"role": "user", "content": A1}


def episode(turns: Sequence[str]) -> Episode:
    """Play ``turns`` (Alice first); the conversation is cut after the last one at the latest."""
    return run_episode(
        ConversationEnv(TinyTask(), max_turns=len(turns)),
        ScriptedPolicy.from_turns(list(turns)),
        seed=0,
        options={"index": 0},
    )


def test_merge_uses_edit_distance_over_the_new_texts_length() -> None:
    tree = Tree(task_id="t", sample_id="s", index=0, split="train", seed=0, agents=("Alice", "Bob"),
                system_prompts={"Alice": "a", "Bob": "b"})  # fmt: skip
    base = "Alice: " + "x" * 93  # 100 characters
    tree.insert(episode([base, "B1", "<A>1</A>"]), tree.root, 1.0)
    # 9 edits / 101 < 0.1: merged into the existing child
    close = "Alice: " + "y" * 9 + "x" * 84
    tree.insert(episode([close, "B2", "<A>2</A>"]), tree.root, 0.0)
    assert len(tree.root.children) == 1 and tree.root.children[0].visits == 2
    assert tree.root.children[0].text == base and tree.root.children[0].value == 0.5
    # 11 edits / 101 >= 0.1: a new child
    far = "Alice: " + "y" * 11 + "x" * 82
    tree.insert(episode([far, "B3", "<A>3</A>"]), tree.root, 0.25)
    assert [c.visits for c in tree.root.children] == [2, 1]
    assert tree.root.value == pytest.approx((1.0 + 0.0 + 0.25) / 3)
    assert normalized_edit_distance("ab", "abcd", by="new") == pytest.approx(2 / 5)
    assert normalized_edit_distance("abcd", "ab") == pytest.approx(2 / 5)
    with pytest.raises(TaskContractError, match="does not continue node"):
        tree.insert(episode(["other", "B", "<A>x</A>"]), tree.root.children[0], 0.0)


def test_turns_after_an_ended_node_end_too_and_are_never_candidates() -> None:
    """A variant merged into an agreeing turn, but itself not agreeing, continues the conversation:
    its later turns hang under a node whose path of texts ends, so they cannot be replayed."""
    tree = Tree(task_id="t", sample_id="s", index=0, split="train", seed=0, agents=("Alice", "Bob"),
                system_prompts={"Alice": "a", "Bob": "b"})  # fmt: skip
    tree.insert(episode(["I say <A>h</A>", "yes <A>h</A>"]), tree.root, 1.0)
    agreed = node(tree, "Alice: I say <A>h</A>", "Bob: yes <A>h</A>")
    assert agreed.ended
    # "yes <A>k</A>" is 1 edit from "yes <A>h</A>": merged into the agreeing node, but h != k
    variant = episode(["I say <A>h</A>", "yes <A>k</A>", "no, <A>m</A>", "hmm", "well"])
    assert variant.end_reason == "max_turns" and len(variant.turns) == 5
    tree.insert(variant, tree.root, 0.0)
    (after,) = agreed.children
    assert after.text == "Alice: no, <A>m</A>" and after.children[0].children  # deep enough to select
    assert after.ended and after.children[0].ended
    assert after not in tree.candidates() and agreed not in tree.candidates()
    for n in tree.candidates():  # every candidate's path replays without ending early
        env = ConversationEnv(TinyTask(), max_turns=10)
        env.reset(seed=0, options={"index": 0, "prefix": tree.prefix(n)})  # as the search replays it


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def chain_tree() -> Tree:
    """root → A (→ B → C) and root → D (→ E → F) and root → G (→ H): values 1.0, 0.0, 0.5."""
    tree = Tree(task_id="t", sample_id="s", index=0, split="train", seed=0, agents=("Alice", "Bob"),
                system_prompts={"Alice": "a", "Bob": "b"})  # fmt: skip
    tree.insert(episode(["turn A", "turn B", "turn C one"]), tree.root, 1.0)
    tree.insert(episode(["turn D long text", "turn E", "turn F"]), tree.root, 0.0)
    tree.insert(episode(["turn G something", "<A>h</A>", "<A>h</A>"]), tree.root, 0.5)
    return tree


def test_candidates_exclude_leaves_and_second_to_last_level() -> None:
    tree = chain_tree()
    texts = [n.text for n in tree.candidates()]
    # A's first child B has a child C; B's first child C is a leaf; G → H → (agreeing) leaf
    assert texts == ["", "Alice: turn A", "Alice: turn D long text", "Alice: turn G something"]


def test_selection_is_a_softmax_over_the_top_values() -> None:
    config = TreeSearchConfig(top_k=10)
    tree = chain_tree()
    tree.selected.append(tree.root)  # the root was used: now A (1.0), G (0.5), D (0.0) remain
    z = math.exp(1.0) + math.exp(0.5) + math.exp(0.0)
    p_a, p_g = math.exp(1.0) / z, math.exp(0.5) / z
    picks = []
    for u in (0.0, p_a - 1e-9, p_a + 1e-9, p_a + p_g - 1e-9, p_a + p_g + 1e-9, 0.999999):
        fresh = chain_tree()
        fresh.selected.append(fresh.root)
        picks.append(select_node(fresh, config, FixedRandom(u)).text)
    assert picks == [
        "Alice: turn A",
        "Alice: turn A",
        "Alice: turn G something",
        "Alice: turn G something",
        "Alice: turn D long text",
        "Alice: turn D long text",
    ]
    # top_k=2 leaves D out whatever the draw
    assert select_node(tree, TreeSearchConfig(top_k=2), FixedRandom(0.999999)).text == "Alice: turn G something"


def test_selection_drops_candidates_close_to_selected_nodes() -> None:
    config = TreeSearchConfig(top_k=10)
    tree = chain_tree()
    tree.selected.extend([tree.root, tree.root.children[0]])  # "", "Alice: turn A"
    # "Alice: turn D long text" vs "Alice: turn A": ed 11 / 24 >= 0.25 stays; a selected node never returns
    assert select_node(tree, config, FixedRandom(0.0)).text == "Alice: turn G something"
    strict = TreeSearchConfig(select_edit_threshold=0.9)  # everything is "too close" to something now
    assert select_node(tree, strict, FixedRandom(0.0)) is tree.root
    # A (the best value) is within 6/14 < 0.5 of the selected "Bob: turn B": dropped, so G wins
    other = chain_tree()
    other.selected.extend([other.root, other.root.children[0].children[0]])
    assert normalized_edit_distance("Alice: turn A", "Bob: turn B") == pytest.approx(6 / 14)
    assert normalized_edit_distance("Alice: turn D long text", "Bob: turn B") >= 0.5
    assert select_node(other, TreeSearchConfig(select_edit_threshold=0.5), FixedRandom(0.0)).text == (
        "Alice: turn G something"
    )


def test_same_seed_gives_every_rollout_of_a_tree_the_same_evidence() -> None:
    task = SyntheticChainTask()

    def reply(request: GenerationRequest) -> str:
        facts = request.messages[0]["content"].split("Your information:")[1].split("Guidelines")[0]
        return f"facts {len(facts)} turn {len(request.messages)}"

    trees = build_trees(
        task,
        ScriptedPolicy(reply),
        [3, 4],
        reward_fn=lambda eps: [0.0] * len(eps),
        search=TreeSearchConfig(selections=2, rollouts=2), generation=GenerationConfig(max_turns=3),
    )
    for tree in trees:
        prompts = {tuple(sorted(t.episode.system_prompts.items())) for t in tree.trajectories}
        assert len(prompts) == 1 and len(tree.trajectories) == 4
    assert trees[0].system_prompts != trees[1].system_prompts


def test_mcts_reward_scores_with_a_constant_normalizer_and_caches_losses() -> None:
    calls: list[list[str]] = []

    def readability(texts):
        calls.append(list(texts))
        return [2.0] * len(texts)

    eps = [episode(["Alice: hi there Bob", "Bob: <A>Paris</A>", "Alice: <A>Paris</A>"])] * 2
    reward = EpisodeScorer(RewardConfig(impersonation="mcts"), normalizer=50.0, readability=readability,
                           cache_turns=True)  # fmt: skip
    totals = reward(eps)
    reward(eps)  # every text cached: no second call
    assert len(calls) == 1 and sorted(calls[0]) == sorted({t.text for t in eps[0].turns})
    config = RewardConfig(impersonation="mcts")
    expected = score_episode(replace(eps[0], lm_loss=2.0), config=config, normalizer=50.0).total
    assert totals == [expected, expected]
    impersonating = episode(["Alice: Bob: <A>Paris</A>", "Bob: <A>Paris</A>"])
    assert reward.score([impersonating])[0].reward.task == 0.0  # MCTS impersonation rule


def test_build_trees_rejects_bad_arguments() -> None:
    policy = ScriptedPolicy(CountingScript())
    with pytest.raises(TaskContractError, match=r"got \['max_turns'\]; set generation.max_turns instead"):
        EnvSettings(extra={"max_turns": 3})
    with pytest.raises(TaskContractError, match="set tokenizer instead"):
        EnvSettings(extra={"tokenizer": None})
    with pytest.raises(TaskContractError, match="instance index"):
        build_trees(TinyTask(), policy, [5], reward_fn=answer_reward)
    with pytest.raises(ScoringError, match="one each"):
        build_trees(TinyTask(), policy, [0], reward_fn=lambda eps: [1.0])
    with pytest.raises(ScoringError, match="finite"):
        build_trees(TinyTask(), policy, [0], reward_fn=lambda eps: [math.nan] * len(eps))
    with pytest.raises(ConfigError, match="tree.selections"):
        TreeSearchConfig(selections=0)


def test_code_minmax_tracking_can_go_stale_exact_does_not() -> None:
    tree = Tree(task_id="t", sample_id="s", index=0, split="train", seed=0, agents=("Alice", "Bob"),
                system_prompts={"Alice": "a", "Bob": "b"})  # fmt: skip
    x, y = ["apples and pears", "B"], ["zebra crossing here", "B"]
    for turns, reward in ((x, 1.0), (y, 0.5), (x, 0.0), (x, 0.0)):
        tree.insert(episode(turns), tree.root, reward)
    # X: 1, 0.5, 1/3 ; Y: 0.5. The incremental tracker kept X as max after X dropped below Y.
    assert [round(c.value, 4) for c in tree.root.children] == [0.3333, 0.5]
    assert tree.root.max_child is tree.root.children[0]
    (pair,) = tree.pairs(-1.0, 0.1, minmax="exact")
    assert (pair.chosen, pair.rejected) == ("Alice: zebra crossing here", "Alice: apples and pears")
    assert tree.pairs(-1.0, 0.1) == []  # the default (code): max and min are the same node, no pair
