"""Property-based tests: every registered env survives arbitrary text actions.

Model output can be anything: any unicode, empty strings, 100,000 characters, unbalanced or
nested tags, many ``\\boxed``, one agent speaking for another, one word of 400,000 characters.
Every env must keep its contract: no crash, a valid episode record that round-trips through JSON
and JSONL files whatever the seed and options, scores in [0, 1], finite rewards, and no turn past
the turn cap with the default (model-free) token counter.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optima_env import DataError, Episode, list_tasks, make
from optima_env.io import read_episodes, write_episodes
from optima_env.spaces import ACTION_MAX_LENGTH
from optima_env.tokens import RegexTokenCounter

NASTY = [
    "",
    " ",
    "<A>",
    "</A>",
    "<A></A>",
    "<A><A>x</A></A>",
    "<A>x</A" * 50,
    "\\boxed{",
    "\\boxed{\\boxed{1}}",
    "\\boxed{1}" * 200,
    "}" * 100 + "\\boxed{2",
    "Bob: I am Bob now. Alice: and Alice too.",
    "\x00\ud7ff\ue000\U0010ffff",
    "<A>" + "z" * 5000 + "</A>",
]

actions = st.one_of(
    st.text(max_size=300),
    st.sampled_from(NASTY),
    st.builds(  # long repetitions, up to the action length limit (longer actions are refused)
        lambda s, n: (s * n)[:ACTION_MAX_LENGTH],
        st.sampled_from(["a", "<A>", "\\boxed{", "é "]),
        st.integers(1, 100_000),
    ),
    st.builds(lambda a, b: f"{a}<A>{b}</A>", st.text(max_size=40), st.text(max_size=40)),
    st.builds(lambda a: f"\\boxed{{{a}}}", st.text(max_size=40)),
)


def _env_or_skip(task_id: str):
    env = make(task_id)
    try:
        env.reset(seed=0)
    except DataError as exc:
        pytest.skip(f"{task_id}: data unavailable here ({exc})")
    return env


@pytest.mark.parametrize("task_id", list_tasks())
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(turns=st.lists(actions, min_size=1, max_size=12), seed=st.integers(0, 2**31 - 1))
def test_any_text_gives_a_valid_episode(task_id: str, turns: list[str], seed: int) -> None:
    env = _env_or_skip(task_id)
    env.reset(seed=seed)
    for text in turns:
        if env.episode is not None:
            break
        env.step(text)
    while env.episode is None:  # finish with silence until the turn limit
        env.step("")
    episode = env.episode
    assert Episode.from_dict(json.loads(json.dumps(episode.to_dict()))) == episode
    assert 0.0 <= episode.task_score <= 1.0
    assert episode.reward is not None and math.isfinite(episode.reward.total)
    assert episode.terminated != episode.truncated
    assert 1 <= len(episode.turns) <= env.max_turns
    assert episode.num_tokens == sum(t.num_tokens for t in episode.turns)
    assert all(t.text.startswith(f"{t.agent}:") or t.text == "large" for t in episode.turns)


# One word (letters or digits of any script, no spaces) of 1,000 to 390,000 characters: the default
# counter must not count it as one token, and the turn cap must catch it.
long_words = st.builds(
    lambda unit, n: unit * n,
    st.text(st.characters(categories=("L", "N")), min_size=1, max_size=3),
    st.integers(1_000, 130_000),
)


@pytest.mark.parametrize("task_id", list_tasks())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=st.lists(st.one_of(long_words, actions), min_size=1, max_size=6))
def test_long_words_never_pass_the_turn_cap_with_the_default_counter(task_id: str, turns: list[str]) -> None:
    env = _env_or_skip(task_id)  # no tokenizer: RegexTokenCounter
    assert isinstance(env.token_counter, RegexTokenCounter)
    env.reset(seed=0)
    for text in turns:
        if env.episode is not None:
            break
        env.step(text)
        turn = env.turns[-1]
        word = text.strip()
        gaming = " " not in word and len(word.encode("utf-8", "surrogatepass")) >= 6 * env.turn_token_cap
        if gaming or len(word) > env.turn_char_cap:
            assert turn.text == "large", (len(word), turn.num_tokens)
        if turn.text != "large":
            assert turn.num_tokens < env.turn_token_cap and len(turn.text) <= env.turn_char_cap


seeds = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70),
    st.integers(0, 2**63 - 1).map(np.int64),
    st.integers(0, 2**16 - 1).map(np.uint16),
)
plain_turns = st.text(st.characters(exclude_characters="<>\\{}"), max_size=60)


@pytest.fixture(scope="module")
def jsonl_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("jsonl")


@pytest.mark.parametrize("task_id", list_tasks())
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    seed=seeds,
    prefix=st.lists(plain_turns, max_size=2),
    turns=st.lists(actions, max_size=10),
    data=st.data(),
)
def test_every_episode_round_trips_through_jsonl(task_id, jsonl_dir, seed, prefix, turns, data) -> None:
    env = _env_or_skip(task_id)
    options: dict = {"prefix": prefix}
    if data.draw(st.booleans(), label="pick index"):
        options["index"] = data.draw(st.integers(0, len(env.task.samples("train")) - 1), label="index")
    if env.task.num_formats and data.draw(st.booleans(), label="pick format"):
        options["format_index"] = data.draw(st.integers(0, env.task.num_formats - 1), label="format_index")
    env.reset(seed=seed, options=options)
    for text in turns:
        if env.episode is not None:
            break
        env.step(text)
    while env.episode is None:
        env.step("")
    episode = env.episode
    assert episode.seed == (None if seed is None else int(seed)) and type(episode.seed) in (int, type(None))
    assert Episode.from_dict(json.loads(json.dumps(episode.to_dict()))) == episode
    path = jsonl_dir / f"{task_id.replace('/', '_')}.jsonl"
    write_episodes(path, [episode, episode])
    assert read_episodes(path) == [episode, episode]


def test_text_with_a_lone_surrogate_is_stored_and_read_back_unchanged(tmp_path) -> None:
    """UTF-8 cannot encode a lone surrogate (hypothesis drew one in a turn); the writers escape it."""
    from optima_env.io import append_jsonl, read_json_object, read_jsonl, write_json_atomic

    record = {"text": "a\ud800b é"}
    write_json_atomic(tmp_path / "one.json", record)
    assert read_json_object(tmp_path / "one.json") == record
    append_jsonl(tmp_path / "many.jsonl", [record, {"text": "é"}])
    assert list(read_jsonl(tmp_path / "many.jsonl")) == [record, {"text": "é"}]
    assert "é" in (tmp_path / "many.jsonl").read_text(encoding="utf-8")  # other lines stay readable
