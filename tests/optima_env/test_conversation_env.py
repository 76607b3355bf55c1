"""The conversation env: PettingZoo conformance and the termination rules of spec §2.4."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pettingzoo.test import api_test, parallel_api_test
from pettingzoo.utils.conversions import aec_to_parallel

from optima_env import (
    ConversationEnv,
    DataError,
    Episode,
    TaskContractError,
    list_tasks,
    make,
    make_parallel,
    make_task,
)
from optima_env.policy import ScriptedPolicy
from optima_env.rollout import run_episode
from optima_env.spaces import ConversationText
from optima_env.tokens import RegexTokenCounter
from tests.helpers import TinyTask


def play(env: ConversationEnv, turns: list[str], *, seed: int = 0, index: int = 0) -> Episode:
    """Step the env through scripted utterances until it ends; fails if turns run out."""
    env.reset(seed=seed, options={"index": index})
    for text in turns:
        env.step(text)
        if env.episode is not None:
            return env.episode
    raise AssertionError(f"episode did not end after {len(turns)} turns")


@pytest.fixture
def tiny_env() -> ConversationEnv:
    return ConversationEnv(TinyTask())


# -- PettingZoo conformance ---------------------------------------------------------------------


@pytest.mark.parametrize("task_id", list_tasks())
def test_api_test_passes_on_every_registered_task(task_id: str) -> None:
    env = make(task_id)
    try:
        env.reset(seed=0)
    except DataError as exc:  # tests/optima_env/test_conformance.py covers these tasks on fixtures
        pytest.skip(f"{task_id}: data unavailable here ({exc})")
    api_test(env, num_cycles=200)


def test_api_test_passes_on_three_agents() -> None:
    api_test(make("ie/synth-v0", num_agents=3), num_cycles=200)


def test_parallel_api_test_via_aec_to_parallel() -> None:
    parallel_api_test(aec_to_parallel(make("ie/synth-v0", cycle_aligned=True)), num_cycles=300)
    parallel_api_test(make_parallel("ie/synth-v0", num_agents=3), num_cycles=300)


def test_cycle_aligned_env_ends_at_the_end_of_the_rotation() -> None:
    env = ConversationEnv(TinyTask(num_agents=3), cycle_aligned=True)
    env.reset(seed=0, options={"index": 0})
    env.step("<A>Paris</A>")
    env.step("<A>Paris</A>")  # Bob agrees: the episode is over, its record complete
    assert env.episode is not None and len(env.episode.turns) == 2
    assert not env.terminations["Charlie"] and env.agent_selection == "Charlie"
    env.step("ignored")  # Charlie passes; the rotation ends and everyone is terminated
    assert all(env.terminations.values()) and env.rewards["Alice"] == env.episode.reward.total
    assert len(env.episode.turns) == 2


def test_text_space_accepts_any_unicode_and_rejects_non_text() -> None:
    space = ConversationText(max_length=10)
    assert space.contains("日本語 ✓ <A>")
    assert space.contains("")
    assert not space.contains("x" * 11)
    assert not space.contains(b"bytes")
    assert all(space.contains(space.sample()) for _ in range(50))


# -- termination rules (spec §2.4) -----------------------------------------------------------------


def test_alice_speaks_first_and_agents_alternate(tiny_env: ConversationEnv) -> None:
    episode = play(tiny_env, ["hi", "hello", "x", "y", "z", "w", "a", "b", "c", "d"])
    assert [t.agent for t in episode.turns] == ["Alice", "Bob"] * 5


def test_same_answer_twice_in_a_row_terminates(tiny_env: ConversationEnv) -> None:
    episode = play(tiny_env, ["I think <A>Paris</A>", "agreed <A>Paris</A>"])
    assert episode.terminated and not episode.truncated
    assert episode.end_reason == "agreement"
    assert episode.final_answer == "Paris"
    assert episode.task_score == 1.0
    assert len(episode.turns) == 2


def test_one_agent_repeating_its_answer_also_terminates(tiny_env: ConversationEnv) -> None:
    # code behaviour (spec §13 item 12): the same answer twice among answer-bearing turns
    episode = play(tiny_env, ["<A>Lyon</A>", "no answer yet", "<A>Lyon</A>"])
    assert episode.terminated and episode.final_answer == "Lyon"
    assert len(episode.turns) == 3


def test_changed_answer_becomes_current_and_match_is_exact(tiny_env: ConversationEnv) -> None:
    episode = play(tiny_env, ["<A>Lyon</A>", "<A>Paris</A>", "<A>paris</A>", "<A>Paris</A>", "<A>Paris</A>"])
    # "paris" != "Paris" (exact match), so the run ends only at turns 4-5
    assert [t.answer for t in episode.turns] == ["Lyon", "Paris", "paris", "Paris", "Paris"]
    assert episode.final_answer == "Paris" and len(episode.turns) == 5


def test_max_turns_truncates_and_keeps_last_answer() -> None:
    env = ConversationEnv(TinyTask(), max_turns=4)
    episode = play(env, ["<A>Lyon</A>", "<A>Nice</A>", "<A>Rome</A>", "hmm"])
    assert episode.truncated and not episode.terminated
    assert episode.end_reason == "max_turns"
    assert episode.final_answer == "Rome"
    assert episode.task_score == 0.0


def test_no_answer_at_all_scores_zero_with_none_answer() -> None:
    env = ConversationEnv(TinyTask(), max_turns=2)
    episode = play(env, ["hello", "hi"])
    assert episode.final_answer is None and episode.task_score == 0.0


def test_turn_over_token_cap_becomes_large_and_ends_episode() -> None:
    env = ConversationEnv(TinyTask(), turn_token_cap=20)
    episode = play(env, ["short", " ".join(["word"] * 30)])
    assert episode.turns[-1].text == "large"
    assert episode.end_reason == "turn_too_long" and episode.truncated
    assert "large_turn" in episode.reward.flags and episode.reward.token == -1.0


def test_name_prefix_is_added_once_and_counted(tiny_env: ConversationEnv) -> None:
    episode = play(tiny_env, ["<A>Paris</A>", "Bob: <A>Paris</A>"])
    assert episode.turns[0].text == "Alice: <A>Paris</A>"
    assert episode.turns[1].text == "Bob: <A>Paris</A>"
    counter = RegexTokenCounter()
    assert episode.turns[0].num_tokens == counter.count("Alice: <A>Paris</A>")
    assert episode.num_tokens == sum(t.num_tokens for t in episode.turns)


def test_token_counts_use_the_given_tokenizer() -> None:
    class CharTokenizer:
        def tokenize(self, text: str) -> list[str]:
            return list(text)

    env = ConversationEnv(TinyTask(), tokenizer=CharTokenizer())
    episode = play(env, ["<A>Paris</A>", "<A>Paris</A>"])
    assert episode.turns[0].num_tokens == len("Alice: <A>Paris</A>")


def test_rewards_are_shared_and_paid_at_the_end(tiny_env: ConversationEnv) -> None:
    tiny_env.reset(seed=0, options={"index": 0})
    tiny_env.step("<A>Paris</A>")
    assert tiny_env.rewards == {"Alice": 0.0, "Bob": 0.0}
    tiny_env.step("<A>Paris</A>")
    episode = tiny_env.episode
    assert episode is not None
    assert tiny_env.rewards["Alice"] == tiny_env.rewards["Bob"] == episode.reward.total
    assert tiny_env.infos["Bob"]["episode"] is episode


def test_chat_messages_follow_the_reference_format(tiny_env: ConversationEnv) -> None:
    tiny_env.reset(seed=0, options={"index": 0})
    tiny_env.step("hello")
    messages = tiny_env.chat_messages("Bob")
    assert messages[0] == {"role": "system", "content": "You are Bob. Where does Ann live?"}
    assert messages[1] == {"role": "assistant", "content": "Alice: hello"}
    alt = ConversationEnv(TinyTask(), message_format="alternating")
    alt.reset(seed=0, options={"index": 0})
    alt.step("hello")
    assert alt.chat_messages("Bob")[1]["role"] == "user"
    assert alt.chat_messages("Alice")[1]["role"] == "assistant"


def test_bad_actions_and_options_raise_clear_errors(tiny_env: ConversationEnv) -> None:
    tiny_env.reset(seed=0)
    with pytest.raises(TaskContractError, match="must be a str"):
        tiny_env.step(42)  # type: ignore[arg-type]
    with pytest.raises(TaskContractError, match="index"):
        tiny_env.reset(seed=0, options={"index": 99})


def test_unknown_reset_options_are_reported(
    tiny_env: ConversationEnv, caplog: pytest.LogCaptureFixture
) -> None:
    tiny_env.reset(seed=0, options={"idx": 0})
    assert "ignoring unknown reset options ['idx']" in caplog.text
    with pytest.raises(TaskContractError, match="max_turns"):
        ConversationEnv(TinyTask(), max_turns=0)


def test_episode_round_trips_through_json(tiny_env: ConversationEnv) -> None:
    episode = play(tiny_env, ["I think <A>Paris</A>", "Bob: <A>Paris</A>"])
    again = Episode.from_dict(json.loads(json.dumps(episode.to_dict())))
    assert again == episode
    assert again.reward is not None and again.reward.flags == episode.reward.flags


def test_episode_end_hook_receives_every_episode(tiny_pm) -> None:
    seen: list[Episode] = []

    class Recorder:
        from optima_env import hookimpl

        @hookimpl
        def optima_episode_end(self, episode: Episode) -> None:
            seen.append(episode)

    tiny_pm.register(Recorder())
    env = make("test/tiny-v0", pm=tiny_pm)
    policy = ScriptedPolicy(lambda r: "<A>Paris</A>")
    first = run_episode(env, policy, seed=1, options={"index": 0})
    second = run_episode(env, policy, seed=2, options={"index": 1})
    assert seen == [first, second]
    assert second.task_score == 0.0 and dataclasses.replace(second, task_score=1.0) != second


def test_make_routes_kwargs_to_env_and_task() -> None:
    env = make("ie/synth-v0", max_turns=3, num_agents=3, hops=3)
    assert env.max_turns == 3
    assert env.possible_agents == ["Alice", "Bob", "Charlie"]
    assert make_task("synth", hops=3).hops == 3


def test_reset_with_a_prefix_replays_turns_and_continues(tiny_env: ConversationEnv) -> None:
    tiny_env.reset(seed=0, options={"index": 0, "prefix": ["hello", "<A>Paris</A>"]})
    assert [t.text for t in tiny_env.turns] == ["Alice: hello", "Bob: <A>Paris</A>"]
    assert tiny_env.agent_selection == "Alice" and tiny_env.episode is None
    tiny_env.step("<A>Paris</A>")
    assert tiny_env.episode is not None and tiny_env.episode.terminated
    with pytest.raises(TaskContractError, match="prefix must stop before"):
        tiny_env.reset(seed=0, options={"index": 0, "prefix": ["<A>x</A>", "<A>x</A>", "more"]})
