"""The debate tasks: roles and prompts (spec §2.2), answer extraction and scoring, episodes.

Fixtures in the upstream schemas cover the rules; with OPTIMA_DATA_DIR set, scripted episodes also
run on real rows of GSM8K, MATH, ARC-Challenge and MMLU.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from optima_env import TaskContractError, make, make_task
from optima_env.policy import GenerationRequest, SamplingParams, ScriptedPolicy
from optima_env.prompts import FORMAT_EXAMPLES
from optima_env.rollout import make_jobs, rollout, run_episode
from tests.helpers import write_task_fixtures


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task_fixtures(tmp_path_factory.mktemp("data"))


def play(env, turns: list[str], index: int = 0):
    return run_episode(env, ScriptedPolicy.from_turns(turns), seed=0, options={"index": index})


# -- roles and prompts ---------------------------------------------------------------------------
@pytest.mark.parametrize("task_id", ["gsm8k", "math", "arc_challenge", "mmlu"])
def test_alice_solves_and_bob_criticizes_without_answering(task_id: str, fixtures: Path) -> None:
    task = make_task(task_id, data_dir=fixtures)
    sample = task.samples("test")[0]
    alice, bob = task.views(sample, rng=random.Random(0)).values()
    assert (alice.agent, alice.role, bob.agent, bob.role) == ("Alice", "solver", "Bob", "critic")
    assert alice.private == bob.private == ()
    question = task.question_text(sample)
    assert f"Question: {question}\n" in alice.system_prompt and f"Question: {question}\n" in bob.system_prompt
    assert "never give the answer" in bob.system_prompt
    assert "\\boxed" not in bob.system_prompt and "<A>" not in bob.system_prompt
    answer_format = "\\boxed{" if task_id in ("gsm8k", "math") else "<A>answer</A>"
    assert answer_format in alice.system_prompt
    assert bob.system_prompt.endswith('Begin your response with "Bob:".')


def test_gsm8k_box_holds_a_number_only_and_math_has_no_pool(fixtures: Path) -> None:
    gsm8k, math = make_task("gsm8k", data_dir=fixtures), make_task("math", data_dir=fixtures)
    prompt = gsm8k.views(gsm8k.samples("test")[0], rng=random.Random(0))["Alice"].system_prompt
    assert "\\boxed{N}, where N is the final number only" in prompt
    for task in (gsm8k, math):
        assert task.num_formats == 0
        with pytest.raises(TaskContractError, match="no format pool"):
            task.views(task.samples("test")[0], rng=random.Random(0), format_index=0)


@pytest.mark.parametrize("task_id", ["arc_challenge", "mmlu"])
def test_only_the_solver_gets_the_format_block(task_id: str, fixtures: Path) -> None:
    task = make_task(task_id, data_dir=fixtures)
    sample = task.samples("test")[0]
    assert task.num_formats == 11
    for k, block in enumerate(FORMAT_EXAMPLES):
        alice, bob = task.views(sample, rng=random.Random(0), format_index=k).values()
        assert block in alice.system_prompt and block not in alice.base_system_prompt
        assert bob.system_prompt == bob.base_system_prompt and block not in bob.system_prompt
    with pytest.raises(TaskContractError, match=r"format_index must be in \[0, 11\)"):
        task.views(sample, rng=random.Random(0), format_index=11)


def test_options_follow_the_question_and_gold_is_the_option_text(fixtures: Path) -> None:
    arc, mmlu = make_task("arc_challenge", data_dir=fixtures), make_task("mmlu", data_dir=fixtures)
    sample = arc.samples("test")[0]
    assert sample.answer == "the Sun"
    assert arc.question_text(sample) == (
        "Which of these is a source of light?\n"
        "Please choose your answer from ['a mirror', 'the Sun', 'the Moon', 'a window']"
    )
    assert mmlu.question_text(mmlu.samples("test")[0]).endswith(
        "Select an answer from the options ['Ag', 'Au', 'Gd', 'Go'] to fill in the _."
    )


def test_three_agent_debate_has_peers_without_fixed_roles(fixtures: Path) -> None:
    task = make_task("arc_challenge", data_dir=fixtures, num_agents=3)
    views = task.views(task.samples("test")[0], rng=random.Random(0), format_index=2)
    assert [v.role for v in views.values()] == ["peer", "peer", "peer"]
    assert "debating the question below with Bob and Charlie" in views["Alice"].system_prompt
    for view in views.values():
        assert "<A>answer</A>" in view.system_prompt and FORMAT_EXAMPLES[2] in view.system_prompt
    env = make("arc_challenge", data_dir=fixtures, split="test", num_agents=3)
    episode = play(env, ["<A>the Moon</A>", "no: the Moon reflects. <A>the Sun</A>", "<A>the Sun</A>"])
    assert [t.agent for t in episode.turns] == ["Alice", "Bob", "Charlie"]
    assert episode.terminated and episode.final_answer == "the Sun" and episode.task_score == 1.0


# -- answers through the task: extraction, termination and scoring ----------------------------------
def test_math_frac_against_decimal_through_the_task(fixtures: Path) -> None:
    env = make("math", data_dir=fixtures, split="test", math_answers="lenient")  # gold \frac{1}{2}
    episode = play(env, ["2/4 = \\boxed{0.5}", "check the reduction", "yes, \\boxed{.5}"])
    assert episode.terminated and episode.final_answer == "0.5" and episode.task_score == 1.0
    # lenient extraction: \dfrac12 and 1/2 are the same answer, so the agents agree
    episode = play(env, ["\\boxed{\\dfrac12}", "ok", "\\boxed{1/2}"])
    assert [t.answer for t in episode.turns] == ["\\frac{1}{2}", None, "\\frac{1}{2}"]
    assert episode.end_reason == "agreement" and episode.task_score == 1.0
    episode = play(env, ["\\boxed{\\frac{2}{3}}", "wrong", "\\boxed{\\frac{2}{3}}"])
    assert episode.terminated and episode.task_score == 0.0
    assert make_task("math", data_dir=fixtures).extract_answer("no box here") is None


def test_math_code_termination_compares_the_reference_normalized_strings(fixtures: Path) -> None:
    env = make("math", data_dir=fixtures, split="test")  # gold \frac{1}{2}; math_answers="code"
    # the reference normalizer: \dfrac12 -> \dfrac{1}{2} (shorthand fixed, "d" kept); 1/2 stays 1/2
    turns = ["\\boxed{\\dfrac12}", "ok", "\\boxed{1/2}", "yes \\boxed{1/2}"]
    episode = play(env, turns)
    assert [t.answer for t in episode.turns] == ["\\dfrac{1}{2}", None, "1/2", "1/2"]
    assert episode.end_reason == "agreement" and len(episode.turns) == 4
    # ".5" is not "0.5" for the reference normalizer: no agreement after three turns
    episode = play(env, ["\\boxed{0.5}", "check", "\\boxed{.5}", "\\boxed{.5}"])
    assert [t.answer for t in episode.turns] == ["0.5", None, ".5", ".5"] and len(episode.turns) == 4


def test_gsm8k_numeric_and_code_modes(fixtures: Path) -> None:
    env = make("gsm8k", data_dir=fixtures, split="test")  # gold 12
    # the reference: \$12.00 dollars -> "12.00" ("\$", spaces and "dollars" removed) != "12"
    episode = play(env, ["3*4 = \\boxed{\\$12.00 dollars}", "units ok", "\\boxed{12.00}"])
    assert episode.final_answer == "12.00" and episode.task_score == 0.0
    env = make("gsm8k", data_dir=fixtures, split="test", gsm8k_mode="numeric")
    episode = play(env, ["3*4 = \\boxed{\\$12.00 dollars}", "units ok", "\\boxed{12.00}"])
    assert episode.final_answer == "12.00" and episode.task_score == 1.0
    code = make_task("gsm8k", data_dir=fixtures)
    assert (
        code.score("12.00", code.samples("test")[0]) == 0.0 and code.score("12", code.samples("test")[0]) == 1
    )
    with pytest.raises(TaskContractError, match="gsm8k_mode"):
        make_task("gsm8k", gsm8k_mode="exact")


def test_arc_accepts_option_letters_and_labels_unless_strict(fixtures: Path) -> None:
    arc = make_task("arc_challenge", data_dir=fixtures, strict_choice=False)
    sun, balance = arc.samples("test")  # labels A-D; labels 1-3
    assert [arc.score(a, sun) for a in ("B", "(B)", "Answer: B", "the sun.", "A", "the Moon")] == [
        1,
        1,
        1,
        1,
        0,
        0,
    ]
    assert [arc.score(a, balance) for a in ("2", "a balance", "B", "1")] == [1, 1, 0, 0]
    strict = make_task("arc_challenge", data_dir=fixtures)  # the default: the reference's rule
    assert [strict.score(a, sun) for a in ("B", " The Sun ", "the sun.", "\\the Sun\\")] == [0, 1, 0, 1]
    env = make("arc_challenge", data_dir=fixtures, split="test", strict_choice=False)
    episode = play(env, ["light source -> <A>B</A>", "are mirrors sources?", "<A>B</A>"])
    assert episode.final_answer == "B" and episode.task_score == 1.0
    env = make("arc_challenge", data_dir=fixtures, split="test")
    episode = play(env, ["light source -> <A>B</A>", "are mirrors sources?", "<A>B</A>"])
    assert episode.final_answer == "B" and episode.task_score == 0.0
    assert episode.metadata["scorer"] == "exact-match"


# -- scripted episodes on real rows ------------------------------------------------------------------
def oracle(task, samples) -> ScriptedPolicy:
    """The solver gives the gold answer in the task's format, the critic agrees, the solver repeats."""
    boxed = task.family == "debate" and task.num_formats == 0
    answers = {task.question_text(s): s.answer for s in samples}

    def reply(request: GenerationRequest) -> str:
        if request.agent == "Bob":
            return "no error found"
        gold = next(a for q, a in answers.items() if f"Question: {q}\n" in request.messages[0]["content"])
        return f"so \\boxed{{{gold}}}" if boxed else f"<A>{gold}</A>"

    return ScriptedPolicy(reply)


@pytest.mark.data
@pytest.mark.parametrize("task_id", ["gsm8k", "math", "arc_challenge", "mmlu"])
def test_scripted_episodes_on_real_rows(task_id: str, data_dir: Path) -> None:
    task = make_task(task_id, data_dir=data_dir)
    samples = task.samples("test")[:6]
    episodes = rollout(
        task,
        oracle(task, samples),
        jobs=make_jobs(range(len(samples)), num_samples=1, seed=0),
        sampling=SamplingParams(temperature=0.0),
        env_kwargs={"split": "test", "diverse_formats": task.num_formats > 0},
    )
    assert [e.sample_id for e in episodes] == [s.id for s in samples]
    for episode in episodes:
        assert [t.agent for t in episode.turns] == ["Alice", "Bob", "Alice"]
        assert episode.end_reason == "agreement" and episode.task_score == 1.0
        assert (episode.format_index is not None) == (task.num_formats > 0)
        assert episode.base_system_prompts["Bob"] == episode.system_prompts["Bob"]
