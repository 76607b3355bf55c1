"""The pair rules beyond the reference, on hand-built trees: task credit, visits,
capped and depth-cut chosen turns; the defaults keep the reference's pairs; and the tree stage's
per-pair record (``pairs_detail.jsonl``), written, read back and resumed."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from optima_env import ConversationEnv
from optima_env.errors import DataError, OptimaError
from optima_env.policy import ScriptedPolicy, request_seed
from optima_env.reward import RewardBreakdown
from optima_env.rollout import run_episode
from optima_env.types import Episode
from optima_trainers.config.env import EnvSettings
from optima_trainers.config.train import GenerationConfig, TreeSearchConfig, resolve_config
from optima_trainers.dpo.pairs import PAIR_DETAILS, prune_pair_details, read_pair_details
from optima_trainers.run.records import PairDetail, read_pairs
from optima_trainers.tree.nodes import Tree
from tests.helpers import TinyTask


def episode(turns: list[str]) -> Episode:
    """Play ``turns`` (Alice first) on the tiny task; cut after the last one at the latest."""
    env = ConversationEnv(TinyTask(), max_turns=len(turns))
    return run_episode(env, ScriptedPolicy.from_turns(list(turns)), seed=0, options={"index": 0})


def tree(**search) -> Tree:
    return Tree(task_id="t", sample_id="s", index=0, split="train", seed=0, agents=("Alice", "Bob"),
                system_prompts={"Alice": "a", "Bob": "b"}, search=TreeSearchConfig(**search),
                generation=GenerationConfig(max_new_tokens=13))  # fmt: skip


def scored(turns: list[str], *, task: float, token: float = -0.1, readability: float = 0.2) -> Episode:
    """A played episode with the reward breakdown given here (total = the three terms)."""
    total = task + token + readability
    breakdown = RewardBreakdown(task=task, token=token, readability=readability, total=total, num_tokens=9,
                                normalizer=10.0)  # fmt: skip
    return replace(episode(turns), reward=breakdown)


def grow(t: Tree, rollouts: list[tuple[list[str], float]]) -> Tree:
    for turns, task in rollouts:
        e = scored(turns, task=task)
        t.insert(e, t.root, e.reward.total)
    return t


X, Y, Z = ["short and confident", "ok"], ["a quite different turn", "ok"], ["zzz words words", "ok"]


def credit_tree(**search) -> Tree:
    """Root children X 0.9 (task 0, readable), Y 0.5 (task 1, unreadable), Z 0.1 (task 0)."""
    t = tree(**search)
    for turns, task, readability in ((X, 0.0, 1.0), (Y, 1.0, -0.4), (Z, 0.0, 0.2)):
        e = scored(turns, task=task, token=-0.1, readability=readability)
        t.insert(e, t.root, e.reward.total)
    return t


def test_nodes_track_task_credit_terms_and_depth_cuts() -> None:
    t = grow(tree(), [(X, 1.0), (X, 0.0)])
    (x,) = t.root.children
    assert x.visits == 2 and x.task_credit == 0.5 and x.depth_cuts == 2  # both ran to max_turns
    assert x.mean_term("token") == pytest.approx(-0.1) and x.mean_term("readability") == pytest.approx(0.2)
    # a float reward without a breakdown: the episode's task score is the credit, no terms
    plain = replace(episode(["I say <A>h</A>", "yes <A>h</A>"]), reward=None, task_score=0.75)
    t.insert(plain, t.root, 0.3)
    agreed = t.root.children[1]
    assert (agreed.task_credit, agreed.scored, agreed.mean_term("token"), agreed.depth_cuts) == (
        0.75,
        0,
        None,
        0,
    )
    assert t.root.task_credit == pytest.approx((1.0 + 0.0 + 0.75) / 3) and t.root.scored == 2


def test_task_credit_keeps_a_pair_only_when_the_chosen_side_earned_more_task() -> None:
    off = credit_tree(minmax="exact")
    assert [n.value for n in off.root.children] == pytest.approx([0.9, 0.5, 0.1])
    (pair,) = off.pairs()  # the reference: best (X, task 0) against worst (Z, task 0)
    assert (pair.chosen, pair.rejected) == ("Alice: short and confident", "Alice: zzz words words")
    on = credit_tree(minmax="exact", pair_task_credit=True)
    assert on.pairs() == []
    (candidate,) = on.pair_candidates()
    assert candidate.reasons == ("task_credit",) and candidate.chosen.task == candidate.rejected.task == 0.0
    # every two children: only Y (0.5, task 1) over Z (0.1, task 0) carries the task
    paper = credit_tree(pair_rule="shared_ancestor", pair_task_credit=True)
    reasons = {(c.pair.chosen, c.pair.rejected): c.reasons for c in paper.pair_candidates()}
    assert reasons == {
        ("Alice: short and confident", "Alice: a quite different turn"): ("task_credit",),
        ("Alice: short and confident", "Alice: zzz words words"): ("task_credit",),
        ("Alice: a quite different turn", "Alice: zzz words words"): (),
    }
    assert [(p.chosen, p.rejected) for p in paper.pairs()] == [
        ("Alice: a quite different turn", "Alice: zzz words words")
    ]


def test_a_minimum_task_gap_drops_pairs_whose_chosen_side_earned_only_a_little_more_task() -> None:
    # X: 2 visits, task credit 0.5 (1.0 and 0.0); Z: 2 visits, task credit 0.4 (0.6 and 0.2)
    rollouts = [(X, 1.0), (X, 0.0), (Z, 0.6), (Z, 0.2)]
    for gap, reasons in ((0.0, ()), (0.05, ()), (0.15, ("task_credit",)), (0.3, ("task_credit",))):
        (candidate,) = grow(
            tree(minmax="exact", pair_task_credit=True, pair_task_gap=gap), rollouts
        ).pair_candidates(-1.0, 0.0)
        assert (candidate.chosen.task, candidate.rejected.task) == pytest.approx((0.5, 0.4))
        assert candidate.reasons == reasons, gap
    # the gap is a margin of the task-credit rule, not a rule of its own
    (alone,) = grow(tree(minmax="exact", pair_task_gap=0.3), rollouts).pair_candidates(-1.0, 0.0)
    assert alone.reasons == ()
    with pytest.raises(OptimaError, match="pair_task_gap"):
        TreeSearchConfig(pair_task_gap=-0.1)


def test_a_side_with_too_few_visits_is_no_pair_side() -> None:
    rollouts = [(X, 1.0), (X, 1.0), (Y, 0.0), (Z, 0.6), (Z, 0.4)]  # X 2 visits, Y 1, Z 2
    assert [(p.chosen, p.rejected) for p in grow(tree(minmax="exact"), rollouts).pairs(-1.0, 0.1)] == [
        ("Alice: short and confident", "Alice: a quite different turn")
    ]
    exact = grow(tree(minmax="exact", min_pair_visits=2), rollouts)
    assert [(p.chosen, p.rejected) for p in exact.pairs(-1.0, 0.1)] == [
        ("Alice: short and confident", "Alice: zzz words words")  # Y is left out, not the pair
    ]
    code = grow(tree(minmax="code", min_pair_visits=2), rollouts)  # the tracked max/min: X and Y
    (candidate,) = code.pair_candidates(-1.0, 0.1)
    assert candidate.reasons == ("visits",) and candidate.rejected.visits == 1
    few = grow(tree(minmax="exact", min_pair_visits=3), rollouts)
    (candidate,) = few.pair_candidates(-1.0, 0.1)
    assert candidate.reasons == ("visits",) and few.pairs(-1.0, 0.1) == []


LONG = ["I say a long long long turn of many words here", "yes"]  # 13 tokens: the cap


def test_capped_and_all_depth_cut_chosen_sides_follow_train_capped_turns() -> None:
    capped = grow(tree(minmax="exact"), [(LONG, 1.0), (["I say <A>h</A>", "yes <A>h</A>"], 0.0)])
    chosen = capped.root.children[0]
    assert chosen.capped and not capped.root.children[1].capped
    assert len(capped.pairs()) == 1  # the reference trains it
    (candidate,) = capped.pair_candidates(train_capped_turns=False)
    assert candidate.reasons == ("capped", "depth_cut") and candidate.chosen.capped
    assert capped.pairs(train_capped_turns=False) == []
    # depth cut: X's only rollout ran to max_turns; a second one that agrees lifts the rule
    cut = grow(tree(minmax="exact"), [(X, 1.0), (["I say <A>h</A>", "yes <A>h</A>"], 0.0)])
    (candidate,) = cut.pair_candidates(train_capped_turns=False)
    assert candidate.reasons == ("depth_cut",) and candidate.chosen.depth_cuts == candidate.chosen.visits == 1
    done = scored(["short and confident", "<A>h</A>", "<A>h</A>"], task=1.0)
    assert done.end_reason == "agreement"
    cut.insert(done, cut.root, done.reward.total)
    x = cut.root.children[0]
    assert x.visits == 2 and x.depth_cuts == 1
    assert [c.reasons for c in cut.pair_candidates(train_capped_turns=False)] == [()]


def reference_pairs(t: Tree) -> list[tuple]:
    """The reference's rule as it stood before the switches: per parent, the (tracked or exact)
    best against worst, kept when ``best > θ_filter`` and ``best - worst > θ_diff``."""
    out = []
    for n in t.pair_parents():
        if t.search.pair_rule == "per_parent":
            best, worst = n.best_and_worst(t.search.minmax)
            proposed = [] if best is worst else [(best, worst)]
        else:
            kids = n.children
            proposed = [
                (a, b) if a.value >= b.value else (b, a) for i, a in enumerate(kids) for b in kids[i + 1 :]
            ]
        out += [
            (n.id, b.text, w.text, b.value, w.value)
            for b, w in proposed
            if b.value > t.search.theta_filter and b.value - w.value > t.search.theta_diff
        ]
    return out


def random_tree(seed: int, **search) -> Tree:
    """Twenty rollouts of 3 turns drawn from a few texts, each with a drawn reward and task term."""
    rng = random.Random(seed)
    t = tree(**search)
    words = ["alpha one", "beta two", "gamma three", "delta four"]
    for _ in range(20):
        turns = [rng.choice(words) + " " + rng.choice("xyz") for _ in range(3)]
        e = scored(turns, task=rng.choice([0.0, 0.5, 1.0]), token=-rng.random() / 2)
        t.insert(e, t.root, e.reward.total)
    return t


@pytest.mark.parametrize("rule", ["per_parent", "shared_ancestor"])
@pytest.mark.parametrize("minmax", ["code", "exact"])
def test_the_defaults_keep_the_reference_pairs(rule: str, minmax: str) -> None:
    for seed in range(5):
        t = random_tree(seed, pair_rule=rule, minmax=minmax, theta_filter=0.3, theta_diff=0.1)
        got = [(p.depth, p.chosen, p.rejected, p.chosen_value, p.rejected_value) for p in t.pairs()]
        want = reference_pairs(t)
        assert [g[1:] for g in got] == [w[1:] for w in want]
        # the switches at their defaults drop nothing the thresholds keep
        assert {r for c in t.pair_candidates() for r in c.reasons} <= {"theta_filter", "theta_diff"}
        assert len(t.pairs(train_capped_turns=True)) == len(got)
    assert want and any(c.reasons for c in t.pair_candidates())  # both kept and dropped pairs were seen
    assert TreeSearchConfig().min_pair_visits == 1 and not TreeSearchConfig().pair_task_credit


def test_bad_settings_and_records_get_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"tree\.min_pair_visits"):
        TreeSearchConfig(min_pair_visits=0)
    path = tmp_path / PAIR_DETAILS
    path.write_text('{"chunk": 0}\n{"chunk": 1}\n')
    with pytest.raises(DataError, match="field 'sample_id': missing"):
        read_pair_details(path)
    (candidate,) = credit_tree(minmax="exact", pair_task_credit=True).pair_candidates()
    row = PairDetail.of(candidate, chunk=0, selected=False).to_dict() | {"reasons": ["bored"]}
    with pytest.raises(DataError, match="unknown \\['bored'\\]"):
        PairDetail.from_dict(row)


# -- the tree stage writes every candidate pair, reads back, and resumes ----------------------------------
def run_stage(folder: Path, **overrides) -> None:
    from optima_task_synth import SyntheticChainTask

    from optima_trainers.generation.tree_stage import generate_tree_stage

    class Varied:
        """Replies chosen by each request's sampling key (a rollout's own), so that trees branch
        and a regrown chunk equals the lost one."""

        def generate(self, requests, sampling):
            replies = ["<A>x</A>", "I guess <A>y</A> maybe", "no idea at all, sorry"]
            return [replies[request_seed(sampling.seed or 0, r.key) % 3] for r in requests]

    task = SyntheticChainTask(train_size=4)
    task.bind("ie/synth-v0")
    sizes = {"generation.max_turns": 2, "tree.instances": 2, "tree.normalizer_instances": 1,
             "tree.selections": 2, "tree.theta_filter": -100.0, "tree.theta_diff": 0.0,
             "generation.concurrency": 3,
             "reward.short_trajectory_tokens": None, **overrides}  # fmt: skip
    config = resolve_config("ie/synth-v0", "idpo", overrides=sizes)
    policy, readability = Varied(), (lambda texts: [2.0] * len(texts))
    from optima_trainers.generation.rollouts import GenerationContext
    from optima_trainers.run.stages import Stage

    class Events:
        def optima_episode_scored(self, **kwargs) -> None:
            pass

    ctx = GenerationContext(
        task=task, config=config, stage=Stage(name="iter_01", kind="dpo", number=1, generate="tree"),
        folder=folder, seed=0, num_train=4, load_policy=lambda: policy, release=lambda p: None,
        env=lambda p, diverse=False: EnvSettings(scoring=False), readability=lambda: readability, events=Events(),
        phase=lambda *a: None,
    )  # fmt: skip
    generate_tree_stage(ctx, normalizer_indices=[0], tree_positions=[1, 2])


def test_the_tree_stage_records_every_candidate_pair(tmp_path: Path) -> None:
    run_stage(tmp_path)
    details = read_pair_details(tmp_path / PAIR_DETAILS)
    pairs = read_pairs(tmp_path / "pairs.jsonl")
    assert details and pairs and {d.chunk for d in details} == {0, 1}  # one tree per chunk
    selected = [d for d in details if d.selected]
    assert sorted((d.sample_id, d.chosen.text, d.rejected.text, d.chosen.value) for d in selected) == sorted(
        (p.sample_id, p.chosen, p.rejected, p.chosen_value) for p in pairs
    )
    assert all(not d.reasons for d in selected)
    # the stage record's summary of the pairs, as counted from the records
    from optima_trainers.generation.tree_stage import read_tree_stage

    _, _, metrics = read_tree_stage(tmp_path, resolve_config("ie/synth-v0", "idpo"))
    assert metrics["mcts/candidates"] == len(details)
    for reason in ("theta_diff", "task_credit", "visits"):
        assert metrics[f"mcts/dropped/{reason}"] == sum(reason in d.reasons for d in details)
    assert metrics["mcts/gap/total"] == pytest.approx(
        sum(d.chosen.value - d.rejected.value for d in selected) / len(selected)
    )
    task_gap = sum(d.chosen.task - d.rejected.task for d in selected) / len(selected)
    assert metrics["mcts/gap/task"] == pytest.approx(task_gap)
    assert metrics["mcts/visits"] >= 1 and 0 <= metrics["mcts/task_credited"] <= 1
    for d in details:  # the scored rollouts' terms reach the record; the gap is chosen minus rejected
        gap = d.to_dict()["gap"]
        assert d.chosen.token is not None and gap["total"] == d.chosen.value - d.rejected.value
        assert gap["task"] == d.chosen.task - d.rejected.task
        assert d.chosen.visits >= 1 and d.chosen.value >= d.rejected.value
    # a kill after a chunk's records but before its trees line: the resumed stage writes them once
    text = (tmp_path / PAIR_DETAILS).read_text()
    lines = (tmp_path / "trees.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "trees.jsonl").write_text(lines[0])
    (tmp_path / PAIR_DETAILS).write_text(text + text.splitlines(keepends=True)[-1][:20])  # a torn tail too
    prune_pair_details(tmp_path / PAIR_DETAILS, {0})
    assert {d.chunk for d in read_pair_details(tmp_path / PAIR_DETAILS)} == {0}
    (tmp_path / PAIR_DETAILS).write_text(text + text.splitlines(keepends=True)[-1][:20])
    run_stage(tmp_path)
    assert (tmp_path / PAIR_DETAILS).read_text() == text
    assert (tmp_path / "trees.jsonl").read_text() == "".join(lines)


def test_the_stage_drops_capped_pairs_under_train_capped_turns_false(tmp_path: Path) -> None:
    run_stage(tmp_path / "a", **{"generation.max_new_tokens": 4})
    run_stage(tmp_path / "b", **{"generation.max_new_tokens": 4, "sft.train_capped_turns": False})
    a, b = read_pair_details(tmp_path / "a" / PAIR_DETAILS), read_pair_details(tmp_path / "b" / PAIR_DETAILS)
    assert [(d.chosen.text, d.rejected.text) for d in a] == [(d.chosen.text, d.rejected.text) for d in b]
    assert any(d.chosen.capped for d in b) and any(d.selected for d in a if d.chosen.capped)
    assert not any(d.selected for d in b if d.chosen.capped or d.chosen.depth_cuts == d.chosen.visits)
    assert all("capped" in d.reasons for d in b if d.chosen.capped)


# -- dpo.rpo_scope: the NLL term on every chosen turn, or on the task-credited pairs only -----------------
def credited_pairs(tasks: list[float | None]) -> list:
    from optima_trainers.run.records import PreferencePair

    return [
        PreferencePair(
            prompt=(
                {"role": "system", "content": f"You are Bob. Question {i}."},
                {"role": "assistant", "content": "Alice: hi"},
            ),
            chosen="Bob: <A>Paris</A>",
            rejected=f"Bob: I do not know, maybe far away, number {i}.",
            chosen_value=0.9,
            rejected_value=0.1,
            task_id="t",
            sample_id=f"s{i}",
            instance_index=i,
            depth=1,
            agent="Bob",
            chosen_task=task,
        )
        for i, task in enumerate(tasks)
    ]


@pytest.mark.slow
def test_the_credited_nll_scope_trains_the_nll_on_credited_pairs_only(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from optima_trainers.config.training import DPOTrainConfig
    from optima_trainers.dpo.pairs import pairs_to_dpo_dataset
    from optima_trainers.dpo.trainer import train_dpo
    from tests.tiny_model import make_tiny_model

    model = str(make_tiny_model(tmp_path / "start"))

    def losses(name: str, tasks: list[float | None], **config) -> list[dict[str, float]]:
        settings = DPOTrainConfig.cpu(
            learning_rate=1e-3, max_length=256, max_steps=2, evaluate=False, **config
        )
        result = train_dpo(
            model_path=model, pairs=credited_pairs(tasks), config=settings, output_dir=tmp_path / name
        )
        return [h for h in result.history if "loss" in h]

    every = losses("all", [1.0] * 5, rpo_alpha=1.0)
    credited_all = losses("credited_all", [1.0] * 5, rpo_alpha=1.0, rpo_scope="credited")
    for a, b in zip(every, credited_all, strict=True):  # every pair credited: TRL's sft term, step by step
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4) and b["loss/nll"] == pytest.approx(
            a["loss/nll"], rel=1e-4
        )
    plain = losses("plain", [0.0] * 5, rpo_alpha=None)
    none = losses("credited_none", [0.0] * 5, rpo_alpha=1.0, rpo_scope="credited")
    for a, b in zip(plain, none, strict=True):  # no pair credited: plain DPO, no NLL term
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4) and b["loss/nll"] == 0.0
    mixed = losses("credited_mixed", [1.0, 0.0, 0.0, 1.0, 0.5], rpo_alpha=0.5, rpo_scope="credited")
    assert all(h["loss"] == pytest.approx(h["loss/dpo"] + 0.5 * h["loss/nll"], rel=1e-4) for h in mixed)
    assert mixed[0]["loss/nll"] > 5  # the first batch: pair 0 credited (a random model's NLL)
    rows = pairs_to_dpo_dataset(credited_pairs([1.0, 0.0, 0.5]), credited=True)
    assert [r["nll_weight"] for r in rows.train + rows.eval] == [1.0, 0.0, 1.0]
    with pytest.raises(DataError, match="carry no chosen_task"):
        pairs_to_dpo_dataset(credited_pairs([1.0, None]), credited=True)


def test_the_stage_writes_the_chosen_task_credit_only_for_the_credited_scope(tmp_path: Path) -> None:
    run_stage(tmp_path / "all")
    run_stage(tmp_path / "credited", **{"dpo.rpo_scope": "credited"})
    assert "chosen_task" not in (tmp_path / "all" / "pairs.jsonl").read_text()
    plain, credited = (
        read_pairs(tmp_path / "all" / "pairs.jsonl"),
        read_pairs(tmp_path / "credited" / "pairs.jsonl"),
    )
    assert plain and all(p.chosen_task is None for p in plain)
    details = [d for d in read_pair_details(tmp_path / "credited" / PAIR_DETAILS) if d.selected]
    credit = {(d.sample_id, d.depth, d.chosen.text): d.chosen.task for d in details}
    assert [p.chosen_task for p in credited] == [credit[p.sample_id, p.depth, p.chosen] for p in credited]
    assert [replace(p, chosen_task=None) for p in credited] == plain
