"""Bad input at the edges of ConversationEnv: each test gives the bad input and checks
the error it gets, or the rule that must hold whatever the input.

Token caps with the default counter and long words, the action length limit, seeds, calls before
``reset`` and after the end, the declared state, ``scoring=False``, and the atomic writer's mode.
"""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest

from optima_env import Episode, OptimaError, TaskContractError
from optima_env.conversation_env import ConversationEnv
from optima_env.errors import EnvNotResetError, EpisodeOverError
from optima_env.io import write_text_atomic
from optima_env.spaces import ACTION_MAX_LENGTH
from optima_env.task import metric_name
from optima_env.tokens import MAX_CHARS_PER_TOKEN, RegexTokenCounter
from tests.helpers import TinyTask


def tiny_env(**kwargs) -> ConversationEnv:
    return ConversationEnv(TinyTask(), **kwargs)


def play_to_end(env: ConversationEnv) -> Episode:
    env.step("<A>Paris</A>")
    env.step("<A>Paris</A>")  # agreement
    assert env.episode is not None
    return env.episode


# -- token counting and the turn cap ---------------------------------------------------------------
def test_default_counter_cannot_be_gamed_by_long_words() -> None:
    counter = RegexTokenCounter()
    assert counter.count("Alice: <A>42</A>") == 10  # short words and marks: one token each
    assert counter.count("x" * 200_000) == 33_334  # one word of 200,000 characters: not 1 token
    assert counter.count("中" * 3000) == 1500  # 3 UTF-8 bytes per character, 6 bytes per token
    assert counter.count("antidisestablishmentarianism") == 5


def test_a_one_word_200k_character_turn_is_large_with_the_default_counter() -> None:
    env = tiny_env()
    env.reset(seed=0)
    env.step("z" * 200_000)
    episode = env.episode
    assert episode is not None and episode.end_reason == "turn_too_long"
    assert episode.turns[0].text == "large"


class OneTokenCounter:
    """A counter that undercounts everything (a custom counter or a tokenizer with long merges)."""

    def count(self, text: str) -> int:
        return 1


def test_the_turn_cap_fires_on_long_turns_whatever_the_counter() -> None:
    env = tiny_env(tokenizer=OneTokenCounter(), turn_token_cap=100)
    assert env.turn_char_cap == MAX_CHARS_PER_TOKEN * 100
    env.reset(seed=0)
    env.step("a " * 700)  # "Alice: " + 1399 characters: under 1600, kept
    assert env.episode is None and env.turns[0].text.startswith("Alice: a a")
    env.step(" ".join(["word"] * 400))  # 1999 characters + prefix: over the character cap
    assert env.episode is not None and env.episode.end_reason == "turn_too_long"
    assert env.turns[1].text == "large"


def test_an_action_over_the_length_limit_is_refused_with_a_clear_error() -> None:
    env = tiny_env()
    env.reset(seed=0)
    with pytest.raises(TaskContractError, match=r"Alice's action has 400,001 characters; .* at most 400,000"):
        env.step("a" * (ACTION_MAX_LENGTH + 1))
    assert env.turns == ()  # nothing was recorded
    env.step("a" * ACTION_MAX_LENGTH)  # the limit itself is accepted (and is a large turn)
    assert env.episode is not None and env.episode.end_reason == "turn_too_long"


# -- seeds -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", ["abc", 1.5, [1, 2], True, np.float64(2.0), np.bool_(True), b"1"])
def test_a_seed_that_is_not_an_int_or_none_is_refused(seed) -> None:
    env = tiny_env()
    with pytest.raises(TaskContractError, match=r"reset\(seed=...\) expects an int or None .* got"):
        env.reset(seed=seed)


def test_numpy_integer_seeds_are_converted_to_int() -> None:
    env = tiny_env()
    env.reset(seed=np.int64(7))
    episode = play_to_end(env)
    assert episode.seed == 7 and type(episode.seed) is int
    assert Episode.from_dict(json.loads(json.dumps(episode.to_dict()))) == episode
    env.reset(seed=7)
    assert play_to_end(env) == episode


# -- call order ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call",
    [
        lambda env: env.step("hello"),
        lambda env: env.step(None),
        lambda env: env.observe("Alice"),
        lambda env: env.last(),
        lambda env: env.chat_messages("Alice"),
        lambda env: env.sample,
    ],
    ids=["step", "step-none", "observe", "last", "chat_messages", "sample"],
)
def test_using_the_env_before_reset_says_to_call_reset(call) -> None:
    env = tiny_env()
    with pytest.raises(EnvNotResetError, match=r"called before reset\(\); call env.reset\(seed=...\) first"):
        call(env)
    assert issubclass(EnvNotResetError, OptimaError) and issubclass(EnvNotResetError, RuntimeError)


def test_observing_an_unknown_agent_lists_the_agents() -> None:
    env = tiny_env()
    env.reset(seed=0)
    with pytest.raises(TaskContractError, match=r"observe\('Carol'\): no such agent; the agents are"):
        env.observe("Carol")


def test_a_step_after_the_end_says_the_episode_is_over_and_pettingzoo_expects_none() -> None:
    env = tiny_env()
    env.reset(seed=0)
    play_to_end(env)
    with pytest.raises(EpisodeOverError, match=r"ended \(agreement\) after 2 turns.*expects step\(None\)"):
        env.step("one more thing")
    assert issubclass(EpisodeOverError, ValueError)  # PettingZoo raised a ValueError here
    env.step(None)
    env.step(None)  # every agent has left
    assert env.agents == []
    with pytest.raises(EpisodeOverError, match="reset"):
        env.step("x")
    with pytest.raises(EpisodeOverError, match="PettingZoo expects step"):
        env.last()


def test_all_state_is_declared_in_init() -> None:
    env = tiny_env()
    declared = set(vars(env))
    env.reset(seed=0)
    assert set(vars(env)) == declared
    play_to_end(env)
    env.step(None)
    env.step(None)
    assert set(vars(env)) == declared
    for name in ("rewards", "terminations", "truncations", "infos", "_cumulative_rewards", "agent_selection"):
        assert name in declared, name


# -- scoring=False ---------------------------------------------------------------------------------
def test_scoring_false_computes_no_reward_and_pays_zero() -> None:
    env = tiny_env(scoring=False)
    env.reset(seed=0, options={"index": 0})  # the Paris instance
    env.step("<A>Paris</A>")
    env.step("<A>Paris</A>")
    episode = env.episode
    assert episode is not None and episode.reward is None
    assert episode.task_score == 1.0  # the task score is still recorded
    for _agent in env.agent_iter():
        _, reward, terminated, _truncated, info = env.last()
        assert reward == 0.0 and terminated and info["episode"] is episode
        env.step(None)
    assert Episode.from_dict(json.loads(json.dumps(episode.to_dict()))) == episode

    scored = tiny_env()
    scored.reset(seed=0)
    assert play_to_end(scored).reward is not None  # the default scores
    with pytest.raises(TaskContractError, match="scoring must be True or False, got 'no'"):
        tiny_env(scoring="no")


# -- reports: metric names and file modes ----------------------------------------------------------
class ExactMatchTask(TinyTask):
    metric = "exact match"


def test_metric_name_is_the_tasks_own_else_its_familys() -> None:
    assert metric_name(ExactMatchTask()) == "exact match"
    assert metric_name(TinyTask()) == "F1"  # information exchange, no metric declared
    assert metric_name(None, "debate") == "accuracy"
    assert metric_name(None, "riddles") == "score"


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_atomic_writes_apply_the_umask(tmp_path, mask, mode) -> None:
    old = os.umask(mask)
    try:
        write_text_atomic(tmp_path / "report.md", "# report\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "report.md").stat().st_mode) == mode
    assert (tmp_path / "report.md").read_text() == "# report\n"
