"""Property-based tests: every registered env survives arbitrary text actions.

Model output can be anything: any unicode, empty strings, 100,000 characters, unbalanced or
nested tags, many ``\\boxed``, one agent speaking for another. Every env must keep its contract:
no crash, a valid episode record that round-trips through JSON, scores in [0, 1], finite rewards.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optima_env import DataError, Episode, list_tasks, make

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
    st.builds(lambda s, n: s * n, st.sampled_from(["a", "<A>", "\\boxed{", "é "]), st.integers(1, 100_000)),
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
