"""ie/synth-v1: solvable only by exchange, every relation in every hand, the names-gold metric,
and the counterfactual's evidence swap."""

from __future__ import annotations

import random

import pytest
from optima_task_synth import CommunicationChainTask, hand_facts, solve

from optima_env import TaskContractError, make, make_task
from optima_env.policy import ScriptedPolicy
from optima_env.rollout import run_episode


@pytest.mark.parametrize("hops,num_agents", [(2, 2), (3, 2), (4, 2), (2, 3), (3, 3)])
def test_the_union_answers_and_no_hand_does(hops: int, num_agents: int) -> None:
    task = CommunicationChainTask(hops=hops, num_agents=num_agents)
    for index in range(200):
        sample = task.sample("train", index)
        hands = hand_facts(sample)
        subject = sample.metadata["subject"]
        assert solve(subject, [f for hand in hands for f in hand], hops) == sample.answer
        assert all(solve(subject, hand, hops) is None for hand in hands)
        final = hands[(hops - 1) % num_agents]
        assert sum(f.relation == hops - 1 for f in final) == 8  # K candidates, the answer among them
        assert sample.answer in sample.metadata["candidates"]


def test_every_hand_holds_every_relation_kind_and_no_name_hides_in_another() -> None:
    task = CommunicationChainTask(hops=3)
    for index in range(100):
        sample = task.sample("test", index)
        for hand in hand_facts(sample):
            assert {f.relation for f in hand} == {0, 1, 2}
        names = {n for hand in hand_facts(sample) for f in hand for n in (f.subject, f.obj)}
        words = {w.lower() for n in names for w in n.split()[: 1 if n.endswith(_SUFFIXES) else None]}
        assert not any(a != b and a in b for a in words for b in words)


_SUFFIXES = ("Labs", "Corp", "Works", "Systems", "Group")


def test_names_gold_credits_a_sentence_and_refuses_a_list() -> None:
    task = make_task("ie/synth-v1", style="small")
    sample = task.sample("test", 0)
    gold = sample.answer
    rival = next(c for c in sample.metadata["candidates"] if c != gold)
    assert task.score(f"Bob: so it is headquartered in {gold}.", sample) == 1.0
    assert task.score(gold.lower(), sample) == 1.0
    assert task.score(f"{gold} or {rival}", sample) == 0.0
    assert task.score(rival, sample) == 0.0
    assert task.score(f"{gold}ville", sample) == 0.0
    assert task.score(None, sample) == 0.0
    assert task.scorer_name() == "names-gold" and task.metric == "names-gold"


def test_instances_are_deterministic_and_unlike_v0() -> None:
    a, b = CommunicationChainTask(), CommunicationChainTask()
    assert a.sample("train", 7) == b.sample("train", 7)
    assert CommunicationChainTask(seed=1).sample("train", 7) != a.sample("train", 7)
    v0 = make_task("ie/synth-v0")
    assert v0.sample("train", 7).question != a.sample("train", 7).question


def test_swapped_evidence_keeps_the_question_and_gold_and_takes_the_donors_hand() -> None:
    task = make_task("ie/synth-v1", style="small")
    sample, donor = task.sample("test", 0), task.sample("test", 1)
    swapped = task.swap_evidence(sample, donor, "Alice")
    assert swapped.question == sample.question and swapped.answers == sample.answers
    assert swapped.context[0] == donor.context[0] and swapped.context[1] == sample.context[1]
    hands = hand_facts(swapped)
    assert all(solve(sample.metadata["subject"], hand, 2) is None for hand in hands)
    assert solve(sample.metadata["subject"], [f for h in hands for f in h], 2) is None
    views = task.views(swapped, rng=random.Random(0))
    assert donor.context[0].sentences[0] in views["Alice"].system_prompt
    assert sample.question in views["Alice"].system_prompt


def test_agents_that_pass_the_bridging_fact_reach_the_answer_in_the_env() -> None:
    env = make("ie/synth-v1", style="small")

    def reply(request) -> str:
        sample = env.sample
        hands = hand_facts(sample)
        seen = " ".join(m["content"] for m in request.messages[1:])
        mine = hands[env.task.agents.index(request.agent)]
        known = [f for h in hands for f in h if f in mine or f.text in seen]
        heard = [m["content"].split("The answer is ")[-1].rstrip(".") for m in request.messages[1:]]
        answer = solve(sample.metadata["subject"], known, 2) or next(
            (a for a in heard if a in sample.metadata["candidates"]), None
        )
        if answer:
            return f"{request.agent}: The answer is {answer}."
        told = [f.text for f in mine if f.subject == sample.metadata["subject"]]
        return f"{request.agent}: {' '.join(told)}"

    episode = run_episode(env, ScriptedPolicy(reply), seed=3, options={"index": 5})
    assert episode.terminated and episode.task_score == 1.0
    assert episode.metadata["scorer"] == "names-gold"


def test_bad_knobs_raise_clear_errors() -> None:
    with pytest.raises(TaskContractError, match="one hop needs no exchange"):
        CommunicationChainTask(hops=1)
    with pytest.raises(TaskContractError, match="num_candidates"):
        CommunicationChainTask(num_candidates=1)
    with pytest.raises(TaskContractError, match="num_rivals"):
        CommunicationChainTask(num_rivals=9)
    with pytest.raises(TaskContractError, match="num_distractors"):
        CommunicationChainTask(num_distractors=-1)


def test_the_initialization_prompts_add_a_format_example_and_keep_the_base_prompt() -> None:
    task = make_task("ie/synth-v1", style="small")
    sample = task.sample("test", 0)
    plain = task.views(sample, rng=random.Random(0))
    styled = task.views(sample, rng=random.Random(0), format_index=1)
    for agent in task.agents:
        assert styled[agent].base_system_prompt == plain[agent].system_prompt
        assert "For example, you can write a table" in styled[agent].system_prompt
    with pytest.raises(TaskContractError, match="format_index must be in"):
        task.views(sample, rng=random.Random(0), format_index=task.num_formats)
