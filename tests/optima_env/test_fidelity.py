"""The reference code's rules under the default (``code``) settings, and their named alternatives
(spec §2.4, §2.5, §3, §13). Every expected value is worked out by hand in a comment."""

from __future__ import annotations

import subprocess
import sys

import pytest

from optima_env import ConversationEnv
from optima_env.errors import TaskContractError
from optima_env.policy import ScriptedPolicy
from optima_env.readability import turn_template
from optima_env.reward import RewardConfig, score_episode
from optima_env.rollout import run_episode
from optima_env.scoring import (
    extract_boxed,
    normalize_final_answer,
    parse_boxed_answer,
    parse_tagged_answer,
    reference_exact_match,
)
from optima_env.types import Episode, Paragraph, TaskSample, Turn

# -- §2.4 / §2.5: the reference parsers -------------------------------------------------------------


def test_boxed_answers_as_the_reference_parser() -> None:
    # the LAST "\boxed{" (rfind) and braces counted from it: an unclosed last box is no answer
    assert parse_boxed_answer(r"\boxed{1} then \boxed{2") is None
    assert extract_boxed(r"\boxed{1} then \boxed{2") == "1"  # the lenient option falls back
    assert parse_boxed_answer(r"\fbox{3}") is None and extract_boxed(r"\fbox{3}") == "3"
    assert parse_boxed_answer(r"so \boxed{\boxed{4}}") == "4"  # rfind lands on the inner box
    assert parse_boxed_answer(r"x = \boxed{\frac{1}{2}}") == r"\frac{1}{2}"


def test_normalize_final_answer_verbatim_with_its_quirks() -> None:
    assert normalize_final_answer("x = 1,000 dollars") == "1000"  # after "=", " " and "dollars" gone
    assert normalize_final_answer(r"\left(1,2\right)") == r"\le(1,2\right)"  # "ft" cut from \left
    assert normalize_final_answer(r"\text{(B)}") == "(B)"
    assert normalize_final_answer(r"$\frac12$") == r"\frac{1}{2}"  # shorthand fixed, $ dropped
    assert normalize_final_answer(".5") == ".5"  # no leading zero added (the lenient one adds it)


def test_tagged_answers_are_not_stripped_and_exact_match_strips_as_the_reference() -> None:
    assert parse_tagged_answer("Bob: <A> Paris </A>") == " Paris "
    # gold.strip().lower() == answer.strip().strip("\\").lower()
    assert reference_exact_match(" The Sun ", "the sun") == 1.0
    assert reference_exact_match("\\18\\", "18") == 1.0
    assert reference_exact_match("18.00", "18") == 0.0 and reference_exact_match("the sun.", "the sun") == 0.0


# -- env: token F1, unstripped termination, the agreement rule -------------------------------------
class CharTokenizer:
    """A tokenizer whose tokens are characters (so F1 is easy to work out by hand)."""

    def tokenize(self, text: str) -> list[str]:
        return list(text)


SAMPLE = TaskSample(
    id="s",
    question="Where?",
    answers=("Paris",),
    context=(Paragraph(title="Alice", sentences=("a.",)), Paragraph(title="Bob", sentences=("b.",))),
)


def play(turns: list[str], *, tokenizer=None, **task_kwargs) -> Episode:
    from optima_task_synth import SyntheticChainTask

    termination = task_kwargs.pop("termination", "repeat")
    env = ConversationEnv(
        SyntheticChainTask(**task_kwargs), max_turns=len(turns), tokenizer=tokenizer, termination=termination
    )
    return run_episode(env, ScriptedPolicy.from_turns(turns), seed=0, options={"sample": SAMPLE})


def test_ie_f1_over_the_policy_tokenizer_tokens_by_default() -> None:
    turns = ["Alice: <A>the Paris</A>", "Bob: <A>the Paris</A>"]
    # characters of "the paris" (9) vs "paris" (5): 5 shared, P = 5/9, R = 1, F1 = 10/14
    episode = play(turns, tokenizer=CharTokenizer())
    assert episode.task_score == pytest.approx(5 / 7) and episode.metadata["scorer"] == "f1-tokens"
    # SQuAD F1 drops the article: 1.0; without any tokenizer the token F1 falls back to it, and says so
    squad = play(turns, tokenizer=CharTokenizer(), f1="squad")
    assert squad.task_score == 1.0 and squad.metadata["scorer"] == "f1-squad"
    fallback = play(turns)
    assert fallback.task_score == 1.0 and fallback.metadata["scorer"] == "f1-squad (no tokenizer)"
    with pytest.raises(TaskContractError, match="f1 must be one of"):
        play(turns, f1="words")


_FALLBACK_SCRIPT = """
from optima_env import make
from optima_env.types import TaskSample
task = make("ie/hotpotqa-v0", f1=F1).task
sample = TaskSample(id="s", question="q", answers=("Eiffel Tower",))
print(task.score("The Eiffel Tower", sample), task.score("The Eiffel Tower", sample), task.scorer_name())
"""


@pytest.mark.parametrize("mode", ["tokens", "squad"])
def test_f1_without_a_tokenizer_warns_once_that_it_is_not_the_references(mode) -> None:
    # a fresh process through the public env API: "once" is per process
    script = _FALLBACK_SCRIPT.replace("F1", repr(mode))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # SQuAD words drop the article: 1.0 (the reference's Llama-3 tokens give 0.667)
    scorer = "f1-squad (no tokenizer)" if mode == "tokens" else "f1-squad"
    assert done.stdout.split(" ", 2) == ["1.0", "1.0", scorer + "\n"]
    warnings = [line for line in done.stderr.splitlines() if "not the reference's metric" in line]
    assert len(warnings) == (1 if mode == "tokens" else 0), done.stderr
    if warnings:
        assert "ie/hotpotqa-v0" in warnings[0] and "tokenizer=" in warnings[0] and "f1='squad'" in warnings[0]


def test_termination_compares_the_unstripped_answers() -> None:
    turns = ["Alice: <A>Paris</A>", "Bob: <A> Paris</A>", "Alice: <A> Paris</A>"]
    # "Paris" != " Paris": no agreement at turn 2; " Paris" twice: agreement at turn 3
    code = play(turns)
    assert [t.answer for t in code.turns] == ["Paris", " Paris", " Paris"]
    assert code.end_reason == "agreement" and len(code.turns) == 3 and code.final_answer == " Paris"
    assert code.task_score == 1.0  # the scorer strips, as the reference's F1 does
    stripped = play(turns, tag_answers="stripped")
    assert stripped.end_reason == "agreement" and len(stripped.turns) == 2


def test_all_agents_termination_against_the_same_answer_twice_in_a_row() -> None:
    turns = ["Alice: <A>Paris</A>", "Bob: let me think", "Alice: <A>Paris</A>", "Bob: <A>Paris</A>"]
    repeat = play(turns)  # Alice's two answers are consecutive among answer-bearing turns: stop at 3
    assert repeat.end_reason == "agreement" and len(repeat.turns) == 3
    both = play(turns, termination="all_agents")  # Bob has not answered until turn 4
    assert both.end_reason == "agreement" and len(both.turns) == 4
    with pytest.raises(TaskContractError, match="termination must be one of"):
        play(turns, termination="both")


# -- §3: the tree search's reward reads the turns in order -------------------------------------------
def scan_episode(texts: list[str], *, tokens: int, task: float = 1.0) -> Episode:
    """One episode whose first turn carries all ``tokens``; its whole-trajectory lm_loss is 8."""
    agents = ("Alice", "Bob")
    turns = tuple(
        Turn(index=i, agent=agents[i % 2], text=t, num_tokens=tokens if i == 0 else 0)
        for i, t in enumerate(texts)
    )
    return Episode(task_id="t", sample_id="s", seed=0, agents=agents, turns=turns, final_answer="x",
                   gold=("x",), task_score=task, terminated=True, truncated=False, end_reason="agreement",
                   num_tokens=tokens, system_prompts={}, base_system_prompts={}, lm_loss=8.0)  # fmt: skip


MCTS = RewardConfig(impersonation="mcts")


def test_impersonation_readability_covers_only_the_turns_before_it() -> None:
    ep = scan_episode(["Alice: hi", "Bob: ok fine", "Alice: sure Bob: yes"], tokens=50)
    # turn 2 impersonates: task 0; readability over turns 0-1: 1 / max(2, 4) = 0.25; token -0.6*50/100
    got = score_episode(ep, config=MCTS, normalizer=100, turn_losses=[2.0, 4.0, 8.0])
    assert (got.task, got.token, got.readability) == (0.0, pytest.approx(-0.3), 0.25)
    assert got.total == pytest.approx(-0.05) and got.lm_loss == 4.0
    # the whole-trajectory option: readability 1 / 8 over every turn
    whole = score_episode(ep, config=RewardConfig(impersonation="mcts", mcts_turn_scan=False), normalizer=100)
    assert (whole.task, whole.readability) == (0.0, 0.125)


def test_a_repeat_before_the_impersonation_stops_the_scan_and_keeps_the_task_score() -> None:
    ep = scan_episode(["Alice: a b", "Bob: c d", "Alice: a b", "Bob: x Alice: y"], tokens=50)
    got = score_episode(ep, config=MCTS, normalizer=100, turn_losses=[2.0] * 4)
    assert (got.task, got.readability) == (1.0, 0.0) and "repeated_turn" in got.flags


def test_a_trajectory_over_2000_tokens_keeps_its_task_score() -> None:
    ep = scan_episode(["Alice: a Bob: b", "Bob: c"], tokens=2001)
    # not read: readability -1, task kept; token -0.6 * 2001 / 2001
    got = score_episode(ep, config=MCTS, normalizer=2001)
    assert (got.task, got.token, got.readability, got.total) == (1.0, -0.6, -1.0, pytest.approx(-0.6))
    old = score_episode(ep, config=RewardConfig(impersonation="mcts", mcts_turn_scan=False), normalizer=2001)
    assert old.task == 0.0


# -- §3: the readability scorer renders a lone turn with no system prompt -------------------------------
def test_lone_turns_render_without_the_templates_default_system_prompt() -> None:
    transformers = pytest.importorskip("transformers")
    from optima_env.models import ensure_embedded_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(ensure_embedded_model())
    # SmolLM2's ChatML template injects "You are a helpful AI assistant named SmolLM, ..." when no
    # system message is given; the reference scores a lone assistant message with no system prompt
    assert turn_template(tokenizer) == ("<|im_start|>assistant\n", "<|im_end|>", "\n")
    prefix, _, _ = turn_template(tokenizer, system="template")
    assert prefix.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prefix.endswith("<|im_end|>\n<|im_start|>assistant\n")


class Llama3Template:
    """The reference's Llama-3 template (no default system prompt): rendering is left as it is."""

    def apply_chat_template(self, messages, tokenize=False):
        out = "<|begin_of_text|>"
        for m in messages:
            out += f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
        return out


def test_a_template_without_a_default_system_prompt_is_unchanged() -> None:
    expected = ("<|begin_of_text|><|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", "")
    assert turn_template(Llama3Template()) == expected == turn_template(Llama3Template(), system="template")


def test_the_readability_scorer_leaves_out_a_templates_default_system_prompt() -> None:
    import inspect

    from optima_env.readability import TransformersLMLoss

    assert inspect.signature(TransformersLMLoss).parameters["system"].default == "none"
