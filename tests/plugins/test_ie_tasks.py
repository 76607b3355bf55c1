"""The information-exchange tasks: context dealing per spec §2.1, switches, formats, episodes.

HotpotQA runs on real rows when OPTIMA_DATA_DIR is set; 2WikiMultihopQA, TriviaQA and CBT and the
dealing details run on fixtures in the upstream schemas (2WikiMultihopQA's real rows:
tests/plugins/test_2wikimultihopqa_real.py).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from optima_env import TaskContractError, make, make_task
from optima_env.policy import GenerationRequest, SamplingParams, ScriptedPolicy
from optima_env.prompts import FORMAT_EXAMPLES
from optima_env.rollout import make_jobs, rollout, run_episode
from optima_env.scoring import f1
from tests.helpers import CBT_CN, HOTPOT_HF, STORY, TRIVIA_RC, write_task_fixtures

FIRST = {p: s[0] for p, s in zip(HOTPOT_HF[0]["context"]["title"], HOTPOT_HF[0]["context"]["sentences"])}
GOLD = ("Scott Derrickson", "Ed Wood")
DISTRACTORS = ("Ed Wood (film)", "Tyler Bates")


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task_fixtures(tmp_path_factory.mktemp("data"))


_TASKS: dict = {}


def hands(task_id: str, data_dir: Path, seed: int, index: int = 0, **kwargs) -> tuple[tuple[str, ...], ...]:
    """The private units of each agent for one test instance and seed."""
    key = (task_id, str(data_dir), tuple(sorted(kwargs.items())))
    if key not in _TASKS:
        _TASKS[key] = make_task(task_id, data_dir=data_dir, **kwargs)
    task = _TASKS[key]
    views = task.views(task.samples("test")[index], rng=random.Random(seed))
    return tuple(views[a].private for a in task.agents)


# -- HotpotQA dealing (reference default: first sentences, shuffled gold entries, duplicates) ------
def test_hotpotqa_deals_gold_entries_in_turn_and_each_distractor_once(fixtures: Path) -> None:
    for seed in range(50):
        alice, bob = hands("hotpotqa", fixtures, seed)
        gold_alice = [u for u in alice if u in {FIRST[t] for t in GOLD}]
        gold_bob = [u for u in bob if u in {FIRST[t] for t in GOLD}]
        # 3 supporting facts (Ed Wood twice): entries 0 and 2 to Alice, entry 1 to Bob
        assert len(gold_alice) == 2 and len(gold_bob) == 1
        assert Counter(gold_alice + gold_bob) == Counter(
            FIRST[t] for t in ("Scott Derrickson", "Ed Wood", "Ed Wood")
        )
        for title in DISTRACTORS:
            assert (FIRST[title] in alice) + (FIRST[title] in bob) == 1
        assert all(u in FIRST.values() for u in alice + bob)  # first sentences only


def test_hotpotqa_quirks_and_randomness_over_seeds(fixtures: Path) -> None:
    dealt = [hands("hotpotqa", fixtures, seed) for seed in range(200)]
    ed, scott = FIRST["Ed Wood"], FIRST["Scott Derrickson"]
    assert any(ed in a and ed in b for a, b in dealt)  # one gold paragraph reaches both agents
    assert any(scott in a and ed in a for a, b in dealt)  # or both gold paragraphs one agent
    assert any(a.count(ed) == 2 for a, b in dealt)  # or one agent the same paragraph twice
    to_alice = sum(FIRST["Tyler Bates"] in a for a, _ in dealt) / len(dealt)
    assert 0.35 < to_alice < 0.65  # distractors 50/50
    assert dealt[7] == hands("hotpotqa", fixtures, 7)  # same seed, same hands


def test_hotpotqa_strict_split_and_full_paragraphs(fixtures: Path) -> None:
    for seed in range(30):
        alice, bob = hands("hotpotqa", fixtures, seed, strict_split=True)
        gold = {FIRST[t] for t in GOLD}
        assert len(gold & set(alice)) == 1 and len(gold & set(bob)) == 1
    alice, bob = hands("hotpotqa", fixtures, 0, full_paragraphs=True)
    assert "Scott Derrickson (born 1966) is an American director. He lives in Los Angeles." in alice + bob


# -- 2WikiMultihopQA: listed order, full paragraphs -----------------------------------------------
def test_twowiki_deals_supporting_facts_in_listed_order(fixtures: Path) -> None:
    polish = "Polish-Russian War (Wojna polsko-ruska) is a 2009 Polish film"
    for seed in range(20):
        alice, bob = hands("2wikimultihopqa", fixtures, seed)
        assert alice[0].startswith(polish) and bob[0].startswith("Xawery Żuławski (born 22 December 1971")
        assert bob[0].endswith("He is the son of actress Małgorzata Braunek and director Andrzej Żuławski.")
        assert sum("Maheen Khan" in u for u in alice + bob) == 1
    # the comparison question: facts Blind Shaft, Mask, Mask -> Alice: Blind Shaft, Mask; Bob: Mask
    alice, bob = hands("2wikimultihopqa", fixtures, 0, index=1)
    assert [u.split(" is a ")[0] for u in alice] == ["Blind Shaft", "The Mask of Fu Manchu"]
    assert [u.split(" is a ")[0] for u in bob] == ["The Mask of Fu Manchu"]
    alice, bob = hands("2wikimultihopqa", fixtures, 0, index=1, strict_split=True)
    assert [u.split(" is a ")[0] for u in alice] == ["Blind Shaft"]
    assert [u.split(" is a ")[0] for u in bob] == ["The Mask of Fu Manchu"]


# -- TriviaQA: snippets shuffled and dealt in turn --------------------------------------------------
def test_triviaqa_shuffles_snippets_and_deals_them_in_turn(fixtures: Path) -> None:
    snippets = TRIVIA_RC[0]["search_results"]["description"]
    dealt = {hands("triviaqa", fixtures, seed) for seed in range(40)}
    assert dealt == {((snippets[0],), (snippets[1],)), ((snippets[1],), (snippets[0],))}
    task = make_task("triviaqa", data_dir=fixtures)
    assert task.score("Sunset Blvd", task.samples("test")[0]) == 1.0  # best over aliases


# -- CBT: halves and the options suffix ------------------------------------------------------------
def test_cbt_gives_alice_the_first_half_and_bob_the_second(fixtures: Path) -> None:
    alice, bob = hands("cbt", fixtures, 3)
    assert alice == tuple(STORY[:10]) and bob == tuple(STORY[10:])
    task = make_task("cbt", data_dir=fixtures)
    question = task.views(task.samples("test")[0], rng=random.Random(0))["Bob"].system_prompt
    assert CBT_CN[0]["question"] + "\nPlease choose your answer from ['Fox', 'Rabbit'," in question
    charlie = hands("cbt", fixtures, 0, num_agents=3)
    assert [len(h) for h in charlie] == [6, 7, 7] and sum(charlie, ()) == tuple(STORY)


# -- formats, agents, scoring switches ------------------------------------------------------------
@pytest.mark.parametrize("task_id", ["hotpotqa", "2wikimultihopqa", "triviaqa", "cbt"])
def test_every_agent_gets_the_same_format_block_and_the_base_prompt_lacks_it(task_id: str, fixtures: Path):
    task = make_task(task_id, data_dir=fixtures)
    assert task.num_formats == len(FORMAT_EXAMPLES) == 11
    sample = task.samples("test")[0]
    plain = task.views(sample, rng=random.Random(5))
    for k, block in enumerate(FORMAT_EXAMPLES):
        views = task.views(sample, rng=random.Random(5), format_index=k)
        for agent, view in views.items():
            assert block in view.system_prompt and block not in view.base_system_prompt
            assert view.base_system_prompt == plain[agent].system_prompt
            assert view.system_prompt.endswith(f'Begin your response with "{agent}:".')


def test_three_agents_split_the_evidence_and_name_each_other(fixtures: Path) -> None:
    task = make_task("2wikimultihopqa", data_dir=fixtures, num_agents=3)
    views = task.views(task.samples("test")[1], rng=random.Random(0))
    assert list(views) == ["Alice", "Bob", "Charlie"]
    assert "Work with Bob and Charlie" in views["Alice"].system_prompt
    assert [v.private[0].split(" is a ")[0] for v in views.values()] == [
        "Blind Shaft",
        "The Mask of Fu Manchu",
        "The Mask of Fu Manchu",
    ]


@pytest.mark.slow
def test_f1_tokenizer_switch_scores_with_tokenizer_tokens(fixtures: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from optima_env.models import ensure_embedded_model

    tok = transformers.AutoTokenizer.from_pretrained(ensure_embedded_model())
    squad = make_task("2wikimultihopqa", data_dir=fixtures)
    code = make_task("2wikimultihopqa", data_dir=fixtures, f1_tokenizer=tok)
    sample = squad.samples("test")[0]
    answer = "the Malgorzata Braunek"  # no accent: different tokens
    assert code.score(answer, sample) == f1(answer, sample.answers, tokenizer=tok)
    assert code.score(answer, sample) != squad.score(answer, sample)
    assert code.score("Małgorzata Braunek", sample) == 1.0


# -- episodes ----------------------------------------------------------------------------------------
def oracle(answer_of) -> ScriptedPolicy:
    """Alice shares her first unit, then everyone answers the gold answer (looked up by prompt)."""

    def reply(request: GenerationRequest) -> str:
        turn = sum(1 for m in request.messages if m["role"] != "system")
        if turn == 0:
            return "facts: " + request.messages[0]["content"].split("Your information:\n")[1].split("\n")[0]
        return f"<A>{answer_of(request.messages[0]['content'])}</A>"

    return ScriptedPolicy(reply)


@pytest.mark.parametrize("task_id", ["2wikimultihopqa", "triviaqa", "cbt"])
def test_scripted_episodes_on_fixtures(task_id: str, fixtures: Path) -> None:
    env = make(task_id, data_dir=fixtures, split="test")
    for index, sample in enumerate(env.task.samples("test")):
        episode = run_episode(
            env, oracle(lambda _, gold=sample.answer: gold), seed=index, options={"index": index}
        )
        assert episode.terminated and episode.end_reason == "agreement"
        assert [t.agent for t in episode.turns] == ["Alice", "Bob", "Alice"]
        assert episode.final_answer == sample.answer and episode.task_score == 1.0
    wrong = run_episode(env, ScriptedPolicy(lambda r: "<A>Nobody Known</A>"), seed=0, options={"index": 0})
    assert wrong.terminated and wrong.task_score == 0.0


@pytest.mark.data
def test_hotpotqa_real_rows_deal_and_play(data_dir: Path) -> None:
    task = make_task("hotpotqa", data_dir=data_dir)
    samples = task.samples("test")[:8]
    for i, sample in enumerate(samples):
        alice, bob = (v.private for v in task.views(sample, rng=random.Random(i)).values())
        first = {p.title: p.sentences[0].strip() for p in sample.context}
        for title in sample.supporting_titles:
            assert first[title] in alice + bob
        for paragraph in sample.context:
            if paragraph.title not in sample.supporting_titles:
                assert (first[paragraph.title] in alice) + (first[paragraph.title] in bob) == 1
    answers = {task.question_text(s): s.answer for s in samples}

    def answer_of(prompt: str) -> str:
        return next(a for q, a in answers.items() if f"Question: {q}\n" in prompt)

    episodes = rollout(
        task,
        oracle(answer_of),
        jobs=make_jobs(range(len(samples)), num_samples=2, seed=0),
        sampling=SamplingParams(temperature=0.0),
        env_kwargs={"split": "test"},
    )
    assert len(episodes) == 16 and all(e.terminated and e.task_score == 1.0 for e in episodes)
    assert [e.sample_id for e in episodes[::2]] == [s.id for s in samples]


def test_small_style_keeps_the_dealing_and_accepts_plain_answers(fixtures: Path) -> None:
    """style="small" changes the answer extraction, nothing else."""
    paper = make_task("ie/hotpotqa-v0", data_dir=str(fixtures))
    small = make_task("ie/hotpotqa-v0", data_dir=str(fixtures), style="small")
    sample = paper.samples("test")[0]
    a = paper.views(sample, rng=random.Random(3))
    b = small.views(sample, rng=random.Random(3))
    assert a == b  # the same prompts and dealing
    assert small.extract_answer("Alice: Answer: Paris, I think") == "Paris"
    assert small.extract_answer("<A>Lyon</A> and the answer is Paris") == "Lyon"  # the tag wins
    assert paper.extract_answer("Alice: Answer: Paris") is None
    with pytest.raises(TaskContractError, match="style must be one of"):
        make_task("ie/hotpotqa-v0", data_dir=str(fixtures), style="large")


def test_only_the_tasks_with_question_only_copies_take_require_context() -> None:
    """2WikiMultihopQA and TriviaQA pass ``require_context`` to the loader (default: required);
    the other dataset tasks refuse it, naming the ones that take it."""
    assert make_task("ie/2wikimultihopqa-v0").load_options() == {"require_context": True}
    assert make_task("ie/triviaqa-v0", require_context=False).load_options() == {"require_context": False}
    assert make_task("ie/hotpotqa-v0").load_options() == {}
    with pytest.raises(TaskContractError, match=r"\(2wikimultihopqa, triviaqa\); hotpotqa has none"):
        make_task("ie/hotpotqa-v0", require_context=False)
