"""``--model Alice=...,Bob=...``: a different model per agent role in benchmarks.run."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.evaluation.policies import ReaderPolicy, load_policy, parse_agent_models
from optima_env import make_task
from optima_env.errors import TaskContractError
from optima_env.policy import PerAgentPolicy, SamplingParams
from optima_env.rollout import make_jobs, rollout


@pytest.mark.parametrize("spec", ["Alice=", "=x", "Alice=a,Alice=b", "Alice=a,,Bob=b"])
def test_a_malformed_per_agent_spec_says_the_form(spec: str) -> None:
    with pytest.raises(TaskContractError, match="AGENT=MODEL"):
        parse_agent_models(spec)


@pytest.mark.slow
def test_each_agent_plays_with_its_own_model(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tests.tiny_model import make_tiny_model

    tiny = make_tiny_model(tmp_path / "tiny")
    policy, tokenizer = load_policy(f"Alice=scripted,Bob={tiny}", backend="hf", batch_size=4)
    assert isinstance(policy, PerAgentPolicy) and isinstance(policy.policies["Alice"], ReaderPolicy)
    assert tokenizer is None  # the first listed model's (the scripted one counts with the regex)
    episodes = rollout(
        make_task("ie/synth-v0"), policy, jobs=make_jobs([0, 1], 1, 0),
        sampling=SamplingParams(temperature=0.0, max_new_tokens=6), env_kwargs={"max_turns": 3},
    )  # fmt: skip
    for episode in episodes:
        alice = [t.text for t in episode.turns if t.agent == "Alice"]
        bob = [t.text for t in episode.turns if t.agent == "Bob"]
        assert alice and all("<A>" in t for t in alice)  # the scripted reader always tags its answer
        assert bob and not any("<A>" in t for t in bob)  # the random tiny model never does
    assert policy.policies["Alice"].requests == sum(
        1 for e in episodes for t in e.turns if t.agent == "Alice"
    )
