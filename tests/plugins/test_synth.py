"""The embedded synthetic task: determinism, difficulty knobs, and solvable only by exchange."""

from __future__ import annotations

import random

import pytest
from optima_task_synth import Fact, SyntheticChainTask, solve

from optima_env import TaskContractError, make
from optima_env.policy import ScriptedPolicy
from optima_env.rollout import run_episode
from optima_env.scoring import extract_tagged


def hands_of(sample) -> list[list[Fact]]:
    return [[Fact(*f) for f in hand] for hand in sample.metadata["hands"]]


@pytest.mark.parametrize("hops,num_agents", [(2, 2), (3, 2), (4, 2), (2, 3), (3, 3)])
def test_solvable_by_exchange_but_not_by_any_agent_alone(hops: int, num_agents: int) -> None:
    task = SyntheticChainTask(hops=hops, num_agents=num_agents, num_distractors=3)
    for index in range(200):
        sample = task.samples("train")[index]
        subject = sample.metadata["subject"]
        hands = hands_of(sample)
        everything = [f for hand in hands for f in hand]
        assert solve(subject, everything, hops) == sample.answer
        for hand in hands:
            assert solve(subject, hand, hops) is None
        # every agent sees at least two candidates for the last hop: guessing is not enough
        last_objects = {f.obj for f in everything if f.relation == hops - 1}
        assert len(last_objects) >= 2


def test_instances_are_deterministic_and_splits_disjoint() -> None:
    a, b = SyntheticChainTask(), SyntheticChainTask()
    assert a.samples("train")[7] == b.samples("train")[7]
    train_q = {a.samples("train")[i].question for i in range(300)}
    test_q = {a.samples("test")[i].question for i in range(300)}
    assert not train_q & test_q
    assert SyntheticChainTask(seed=1).samples("train")[7] != a.samples("train")[7]


def test_each_agent_prompt_holds_only_its_own_facts() -> None:
    task = SyntheticChainTask()
    sample = task.samples("test")[0]
    views = task.views(sample, rng=random.Random(0))
    alice, bob = views["Alice"], views["Bob"]
    for fact in alice.private:
        assert fact in alice.system_prompt and fact not in bob.system_prompt
    assert sample.question in alice.system_prompt and "Bob" in alice.system_prompt
    assert 'Begin your response with "Alice:"' in alice.system_prompt


def test_agents_exchanging_facts_reach_the_answer_in_the_env() -> None:
    """A scripted policy that shares its facts then answers by solving what it has seen."""
    env = make("ie/synth-v0")

    def reply(request) -> str:
        sample = env.sample
        hands = {p.title: p.sentences for p in sample.context}
        seen = " ".join(m["content"] for m in request.messages[1:])
        facts = [Fact(*f) for hand in sample.metadata["hands"] for f in hand]
        known = [f for f in facts if f.text in hands[request.agent] or f.text in seen]
        heard = [a for a in (extract_tagged(m["content"]) for m in request.messages[1:]) if a]
        answer = heard[-1] if heard else solve(sample.metadata["subject"], known, sample.metadata["hops"])
        return f"<A>{answer}</A>" if answer else " ".join(hands[request.agent])

    episode = run_episode(env, ScriptedPolicy(reply), seed=3, options={"index": 5})
    assert episode.terminated and episode.task_score == 1.0
    assert len(episode.turns) == 3  # Alice shares, Bob answers, Alice confirms


def test_bad_knobs_raise_clear_errors() -> None:
    with pytest.raises(TaskContractError, match="hops"):
        SyntheticChainTask(hops=0)
    with pytest.raises(TaskContractError, match="num_distractors"):
        SyntheticChainTask(num_distractors=0)
    with pytest.raises(TaskContractError, match="num_agents"):
        SyntheticChainTask(num_agents=9)
    with pytest.raises(TaskContractError, match="unknown split"):
        SyntheticChainTask().samples("dev")


def test_small_style_prompt_and_lenient_answers_in_the_env() -> None:
    """style="small": the same prompt; "Answer: x" ends the episode like <A>x</A> does, and a turn
    with neither is its own answer (partial F1 credit)."""
    task = SyntheticChainTask(style="small", num_distractors=1)
    paper = SyntheticChainTask(num_distractors=1)
    sample = task.sample("train", 2)
    assert task.views(sample, rng=random.Random(0)) == paper.views(sample, rng=random.Random(0))
    assert task.extract_answer("Bob: the answer is Tesford.") == "Tesford"
    assert task.extract_answer("Bob: It is Tesford, I think") == "It is Tesford, I think"
    named = f"Bob: I think it is {sample.answer}, yes"
    assert 0.0 < task.score(task.extract_answer(named), sample) < 1.0  # partial credit
    assert task.score(task.extract_answer(f"Bob: Answer: {sample.answer}."), sample) == 1.0
    assert paper.extract_answer("Bob: the answer is Tesford.") is None  # paper: tags only

    env = make("ie/synth-v0", style="small", num_distractors=1)
    gold = env.task.sample("train", 2).answer
    replies = iter(["Alice: I know who works where.", f"Bob: Answer: {gold}.", f"Alice: Answer: {gold}"])
    episode = run_episode(env, ScriptedPolicy(lambda request: next(replies)), seed=0, options={"index": 2})
    assert episode.terminated and episode.final_answer == gold and episode.task_score == 1.0
    with pytest.raises(TaskContractError, match="style"):
        SyntheticChainTask(style="tiny")


def test_one_hop_warm_up_gives_the_answer_to_alice_only() -> None:
    """hops=1: Alice holds the answering fact and a rival; Bob holds only rivals."""
    task = SyntheticChainTask(hops=1, num_distractors=1)
    for index in range(20):
        sample = task.sample("train", index)
        alice, bob = (hand for hand in hands_of(sample))
        subject, gold = sample.metadata["subject"], sample.answer
        assert sample.question.startswith(f"What is the company that {subject} works for?")
        assert solve(subject, alice, 1) == gold and len(alice) == 2
        assert solve(subject, bob, 1) is None  # Bob cannot answer alone
        assert all(f.relation == 0 for f in alice + bob)
