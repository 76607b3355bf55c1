"""The trainers' ``code`` defaults reproduce the reference code, and every spec §13 point has both
presets (``code`` and ``paper``). Every expected value is worked out by hand in a comment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optima_env.episode_scorer import EpisodeScorer
from optima_env.policy import ScriptedPolicy
from optima_env.reward import RewardBreakdown, RewardConfig, percentile_normalizer
from optima_env.types import Episode
from optima_trainers.config.env import EnvSettings
from optima_trainers.config.train import FIDELITY_PRESETS, GenerationConfig, TreeSearchConfig, resolve_config
from optima_trainers.config.training import SelectionConfig
from optima_trainers.dpo.pairs import select_top_pairs
from optima_trainers.sft.selection import draw_sample_id, select_isft
from optima_trainers.tree.nodes import normalized_edit_distance
from optima_trainers.tree.search import Tree, build_trees, select_node
from tests.helpers import TinyTask
from tests.optima_trainers.tree.test_mcts import A1, B_LYON, CountingScript, answer_reward, episode, node


# -- the paper preset and the switches' names ---------------------------------------------------------
def test_the_paper_preset_applies_every_section_13_switch_and_code_keeps_the_defaults() -> None:
    code = resolve_config("ie/synth-v0", "idpo")
    paper = resolve_config("ie/synth-v0", "idpo", preset="paper")
    expected = {
        "selection.threshold_on": ("total", "task"),
        "selection.order": ("code", "paper"),
        "tree.normalizer": ("percentile", "instance_max"),
        "tree.pair_rule": ("per_parent", "shared_ancestor"),
        "tree.edit_distance": ("plus_one", "max_length"),
        "generation.termination": ("repeat", "all_agents"),
    }
    assert set(FIDELITY_PRESETS["paper"]) == set(expected) and FIDELITY_PRESETS["code"] == {}
    for dotted, (code_value, paper_value) in expected.items():
        section, name = dotted.split(".")
        assert getattr(getattr(code, section), name) == code_value, dotted
        assert getattr(getattr(paper, section), name) == paper_value, dotted
    # reference-only details keep their code value under both presets
    for cfg in (code, paper):
        assert (cfg.tree.minmax, cfg.tree.depth_cut, cfg.tree.filtered_parents) == ("code", "error", "drop")
        assert cfg.tree.normalizer_rounding == "int" and cfg.tree_reward.mcts_turn_scan is True


def test_the_switches_are_reachable_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from optima_trainers.cli.train import main

    assert main(["--task", "synth", "--trainer", "idpo", "--print-config"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["tree"]["minmax"] == "code" and default["generation"]["termination"] == "repeat"
    argv = ["--task", "synth", "--trainer", "idpo", "--print-config", "--set", "tree.minmax=exact",
            "--set", "tree.pair_rule=shared_ancestor", "--set", "selection.threshold_on=task"]  # fmt: skip
    assert main(argv) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["tree"]["minmax"] == "exact" and config["tree"]["pair_rule"] == "shared_ancestor"
    assert config["selection"]["threshold_on"] == "task"
    assert main(["--task", "synth", "--trainer", "idpo", "--preset", "paper", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["tree"]["edit_distance"] == "max_length"
    assert (
        main(["--task", "synth", "--trainer", "idpo", "--set", "tree.pair_rule=siblings", "--print-config"])
        == 2
    )


# -- §13 item 1: the selection threshold -------------------------------------------------------------
def scored(sample_id: str, total: float, task: float) -> Episode:
    reward = RewardBreakdown(task=task, token=0.0, readability=0.0, total=total, num_tokens=1, normalizer=1.0)
    return Episode(task_id="t", sample_id=sample_id, seed=0, agents=("Alice",), turns=(), final_answer="x",
                   gold=("x",), task_score=task, terminated=True, truncated=False, end_reason="agreement",
                   num_tokens=1, system_prompts={}, base_system_prompts={}, reward=reward)  # fmt: skip


def test_threshold_on_the_total_reward_or_strictly_on_the_task_score() -> None:
    episodes = [scored("a", 0.9, 0.4), scored("b", 0.55, 0.8), scored("c", 0.5, 0.5), scored("d", 0.2, 1.0)]
    everything = (0.0, 1.0)
    # total >= 0.5: a (0.9), b (0.55), c (0.5, equal passes); ranked by total
    code = select_isft(episodes, SelectionConfig(theta=0.5, keep=everything))
    assert [e.sample_id for e in code] == ["a", "b", "c"]
    # task > 0.5: b (0.8), d (1.0); c's 0.5 is not > 0.5; still in total-reward order
    paper = select_isft(episodes, SelectionConfig(theta=0.5, keep=everything, threshold_on="task"))
    assert [e.sample_id for e in paper] == ["b", "d"]
    assert SelectionConfig.from_mapping(SelectionConfig(threshold_on="task").to_dict()).threshold_on == "task"


# -- §6.3: the normalizer ---------------------------------------------------------------------------
def test_the_percentile_normalizer_is_int_of_the_percentile_plus_one() -> None:
    # np.percentile([10, 15], 50) = 12.5: int(12.5) + 1 = 13 (the reference); 12.5 + 1 = 13.5
    assert percentile_normalizer([10, 15], 50) == 13.0
    assert percentile_normalizer([10, 15], 50, rounding="float") == 13.5


def test_the_per_instance_max_normalizer_of_the_paper() -> None:
    a50, a100 = episode(["Alice: " + "w " * 50, "Bob: x"]), episode(["Alice: " + "w " * 100, "Bob: x"])
    # the tree's max so far, this batch included: both over a100's tokens
    reward = EpisodeScorer(RewardConfig(impersonation="mcts"), normalizer="running")
    first = reward.score([a50, a100])
    assert [e.reward.normalizer for e in first] == [a100.num_tokens] * 2
    assert first[0].reward.token == pytest.approx(-0.6 * a50.num_tokens / a100.num_tokens)
    # a later, shorter rollout of the same tree keeps the max
    assert reward.score([a50])[0].reward.normalizer == a100.num_tokens


# -- §6.2: the depth cut ----------------------------------------------------------------------------
def trees(**overrides) -> list[Tree]:
    search = TreeSearchConfig(**{"selections": 2, "top_k": 1, **overrides})
    return build_trees(TinyTask(), ScriptedPolicy(CountingScript()), [0], reward_fn=answer_reward,
                       search=search, generation=GenerationConfig(max_turns=4))  # fmt: skip


def test_a_rollout_cut_at_the_depth_limit_answers_error() -> None:
    # A1 → B_LYON → "hmm" → "not sure": 4 turns, no agreement. answer_reward: error 0.25, Lyon 0.5
    (code,) = trees()
    assert node(code, A1, B_LYON).value == 0.25
    (cut,) = [t.episode for t in code.trajectories if t.episode.end_reason == "max_turns"]
    assert (cut.final_answer, cut.task_score) == ("error", 0.0)  # "error" vs gold "Paris": F1 0
    (kept,) = trees(depth_cut="last_answer")
    assert node(kept, A1, B_LYON).value == 0.5


# -- §13 item 8: edit distance -----------------------------------------------------------------------
def test_edit_distance_plus_one_forms_and_the_papers_max_length() -> None:
    # ed("abcd", "abcf") = 1: 1 / (4 + 1) = 0.2; paper 1 / 4
    assert normalized_edit_distance("abcd", "abcf") == 0.2
    assert normalized_edit_distance("abcd", "abcf", form="max_length") == 0.25
    # merge form, new text "abcd" (4): 2 / (4 + 1) = 0.4; paper 2 / max(2, 4) = 0.5
    assert normalized_edit_distance("ab", "abcd", by="new") == 0.4
    assert normalized_edit_distance("ab", "abcd", by="new", form="max_length") == 0.5


@pytest.mark.parametrize(("form", "children"), [("plus_one", 1), ("max_length", 2)])
def test_the_merge_decision_follows_the_edit_distance_form(form: str, children: int) -> None:
    tree = Tree(task_id="t", sample_id="s", index=0, split="train", seed=0, agents=("Alice", "Bob"),
                system_prompts={"Alice": "a", "Bob": "b"}, search=TreeSearchConfig(edit_distance=form))  # fmt: skip
    base = "Alice: " + "x" * 93  # 100 characters
    close = "Alice: " + "y" * 10 + "x" * 83  # 10 edits: 10 / 101 < 0.1 merges; 10 / 100 = 0.1 does not
    tree.insert(episode([base, "B1", "<A>1</A>"]), tree.root, 1.0)
    tree.insert(episode([close, "B2", "<A>2</A>"]), tree.root, 0.0)
    assert len(tree.root.children) == children


# -- §13 item 7 and §6.4: the pair rules -------------------------------------------------------------
def three_children(**kwargs) -> Tree:
    tree = Tree(task_id="t", sample_id="s", index=0, split="train", seed=0, agents=("Alice", "Bob"),
                system_prompts={"Alice": "a", "Bob": "b"}, search=TreeSearchConfig(**kwargs))  # fmt: skip
    for text, value in (("apples and pears", 1.0), ("zebra crossing", 0.5), ("quantum physics", 0.0)):
        tree.insert(episode([text, "B", "<A>x</A>"]), tree.root, value)
    return tree


def test_one_pair_per_parent_or_every_two_children_sharing_their_history() -> None:
    # root children 1.0, 0.5, 0.0; θ_filter 0.4, θ_diff 0.2
    (best_worst,) = three_children().pairs(0.4, 0.2)
    assert (best_worst.chosen_value, best_worst.rejected_value) == (1.0, 0.0)
    shared = three_children(pair_rule="shared_ancestor").pairs(0.4, 0.2)
    # (1.0, 0.5), (1.0, 0.0), (0.5, 0.0): every chosen > 0.4 and every gap 0.5 or 1.0 > 0.2
    assert [(p.chosen_value, p.rejected_value) for p in shared] == [(1.0, 0.5), (1.0, 0.0), (0.5, 0.0)]
    assert all(p.prompt == ({"role": "system", "content": "a"},) for p in shared)
    assert len(select_top_pairs([shared])) == 1  # int(0.5 * 3)


# -- §6.2: candidates removed by the similarity filter stay removed ------------------------------------
def test_a_node_removed_by_the_similarity_filter_is_never_a_pair_parent() -> None:
    a, a2 = "x" * 20, "x" * 17 + "yyy"  # "Alice: " + 20 characters each (27): 3 edits
    # merge: 3 / 28 >= 0.1, so A2 is its own node; filter: 3 / 28 < 0.25, so A2 is close to A

    def grown(**kwargs) -> Tree:
        tree = Tree(task_id="t", sample_id="s", index=0, split="train", seed=0, agents=("Alice", "Bob"),
                    system_prompts={"Alice": "a", "Bob": "b"}, search=TreeSearchConfig(**kwargs))  # fmt: skip
        for turns, value in (([a, "B one", "C"], 1.0), ([a, "B two", "C"], 0.0), ([a2, "B3", "C"], 0.5)):
            tree.insert(episode(turns), tree.root, value)
        tree.selected.extend([tree.root, tree.root.children[1]])  # as if the root and A2 were selected
        return tree

    tree = grown()
    assert select_node(tree, TreeSearchConfig(), rng=None) is tree.root  # everything left is close: root
    node_a = tree.root.children[0]
    assert node_a.id in tree.removed and len(node_a.children) == 2
    # the root (selected) keeps its pair (A 0.5 vs A2 0.5: no gap) and A, removed, gives none
    assert [p.depth for p in tree.pairs(-1.0, 0.1, minmax="exact")] == []
    kept = grown(filtered_parents="keep")
    select_node(kept, TreeSearchConfig(), rng=None)
    # A: "B one" (1.0) vs "B two" (0.0), depth 1
    assert [(p.depth, p.chosen_value, p.rejected_value) for p in kept.pairs(-1.0, 0.1)] == [(1, 1.0, 0.0)]


# -- §5 item 2: more draws than the split -----------------------------------------------------------
def test_every_draw_is_its_own_tree() -> None:
    # TinyTask has 2 rows: positions 0, 1, 2 play rows 0, 1, 0; position 2 is cycle 1
    built = build_trees(TinyTask(), ScriptedPolicy(CountingScript()), [0, 1, 0], reward_fn=answer_reward,
                        keys=[0, 1, 2], search=TreeSearchConfig(selections=1), generation=GenerationConfig(max_turns=4))  # fmt: skip
    assert [t.sample_id for t in built] == ["tiny-0", "tiny-1", "tiny-0@1"]
    assert {t.episode.sample_id for t in built[2].trajectories} == {"tiny-0@1"}
    assert draw_sample_id("r", 1119 + 5, 1119) == "r@1"


def generation_context(task, config, folder: Path, policy, *, num_train: int, generate: str = "samples"):
    """The host's generation context around a given policy (the built-in selection, no readability model)."""
    from optima_env.registry import get_plugin_manager
    from optima_trainers.generation.rollouts import GenerationContext
    from optima_trainers.hookspecs import add_trainer_hookspecs
    from optima_trainers.run.stages import Stage

    return GenerationContext(
        task=task, config=config, stage=Stage(name="iter_00", kind="test", number=0, generate=generate),
        folder=folder, seed=0, num_train=num_train, load_policy=lambda: policy, release=lambda p: None,
        env=lambda policy, diverse=False: EnvSettings(scoring=False),
        readability=lambda: (lambda texts: [2.0] * len(texts)),
        events=add_trainer_hookspecs(get_plugin_manager()).hook, phase=lambda *a: None,
    )  # fmt: skip


def test_a_sampled_stage_with_more_draws_than_rows_keeps_each_draw_and_resumes(tmp_path: Path) -> None:
    from optima_task_synth import SyntheticChainTask

    from optima_trainers.generation.samples import generate_sample_stage, read_sample_stage

    task = SyntheticChainTask(train_size=3)
    task.bind("ie/synth-v0")
    config = resolve_config(
        "ie/synth-v0",
        "isft",
        overrides={
            "generation.instances": 5,
            "generation.num_samples": 2,
            "generation.max_turns": 2,
            "selection.theta": -100.0,
        },
    )

    def run(folder: Path) -> tuple[list[Episode], list[Episode]]:
        ctx = generation_context(task, config, folder, ScriptedPolicy(lambda r: "<A>x</A>"), num_train=3)
        generate_sample_stage(ctx, indices=list(range(5)), init=False)
        scored, selected, _ = read_sample_stage(folder)
        return scored, selected

    scored, selected = run(tmp_path / "stage")
    ids = ["synth-0-train-0", "synth-0-train-1", "synth-0-train-2", "synth-0-train-0@1", "synth-0-train-1@1"]
    assert list(dict.fromkeys(e.sample_id for e in scored)) == ids and len(scored) == 10
    assert len(selected) == 3  # int(0.7 * 5) draws, not int(0.7 * 3) rows
    # a crash after 7 of the 10 episodes: the rerun plays the other 3 and gets the same data
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    lines = (tmp_path / "stage" / "episodes.jsonl").read_text().splitlines(keepends=True)
    (crashed / "episodes.jsonl").write_text("".join(lines[:7]))
    again, _ = run(crashed)
    assert [e.sample_id for e in again] == [e.sample_id for e in scored]


# -- generation's stops and top_p reach the tree search from the trainer ------------------------------------
def test_the_tree_stage_samples_with_the_runs_stops_and_top_p(tmp_path: Path) -> None:
    from optima_task_synth import SyntheticChainTask

    from optima_trainers.generation.tree_stage import generate_tree_stage

    class Recording:
        def __init__(self) -> None:
            self.sampling: list = []

        def generate(self, requests, sampling):
            self.sampling.append(sampling)
            return ["<A>x</A>"] * len(requests)

    task = SyntheticChainTask(train_size=4)
    task.bind("ie/synth-v0")
    sizes = {"generation.top_p": 0.9, "generation.max_turns": 2, "tree.instances": 1,
             "tree.normalizer_instances": 1, "tree.selections": 1}  # fmt: skip
    config = resolve_config("ie/synth-v0", "idpo", overrides=sizes)
    policy = Recording()
    ctx = generation_context(task, config, tmp_path, policy, num_train=4, generate="tree")
    generate_tree_stage(ctx, normalizer_indices=[0], tree_positions=[1])
    # the normalizer's conversations and the tree's rollouts: the cpu profile's speaker-tag stops
    assert policy.sampling and {(s.top_p, s.stop) for s in policy.sampling} == {(0.9, ("Alice:", "Bob:"))}
