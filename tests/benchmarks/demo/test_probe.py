"""The probe's summary of sampled conversations (``python -m benchmarks.demo.probe --summary``): it
tells a conversation that passed the bridging fact from a lucky guess, and states what guessing
would earn, so a probe whose selection keeps only guesses says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.demo.probe import main, probe_task
from optima_env import make
from optima_env.io import write_episodes
from optima_env.policy import ScriptedPolicy
from optima_env.rollout import run_episode


def _conversation(env, index: int, alice: str, bob: str):
    def reply(request) -> str:
        return f"{request.agent}: {alice if request.agent == 'Alice' else bob}"

    return run_episode(env, ScriptedPolicy(reply), seed=index, options={"index": index})


def test_the_summary_counts_credit_the_bridging_fact_and_what_guessing_earns(tmp_path: Path, capsys) -> None:
    spec = probe_task(4, 4)
    env = make(spec.task, **dict(spec.task_kwargs), max_turns=2)
    episodes = []
    for index, kind in enumerate(("told", "lucky", "wrong", "two")):
        env.reset(seed=index, options={"index": index})
        sample = env.sample
        gold = sample.answers[0]
        others = [c for c in sample.metadata["candidates"] if c != gold]
        bridge = sample.metadata["chain"][0]
        alice = f"{bridge[1]} works for {bridge[2]}." if kind == "told" else "Hello Bob."
        bob = {"told": gold, "lucky": gold, "wrong": others[0], "two": f"{gold} or {others[0]}"}[kind]
        episodes.append(_conversation(env, index, alice, f"<A>{bob}</A>"))
    assert [e.task_score for e in episodes] == [1.0, 1.0, 0.0, 0.0]
    stage = tmp_path / "train" / "isft" / "iter_00"
    stage.mkdir(parents=True)
    write_episodes(stage / "episodes.jsonl", episodes)
    assert main(["--out", str(tmp_path), "--summary"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("iter_00: 4 sampled conversations")
    told = "2 credited by names-gold, the first agent said the bridging entity in 1 of all and in 1 of the "
    assert told + "credited" in line
    assert line.endswith("3 final answers name exactly one candidate, so guessing among the K = 8 would be "
                         "credited about 0.4 times")  # fmt: skip


def test_a_bad_set_flag_says_what_it_expects(tmp_path: Path) -> None:
    from optima_env.configtree import ConfigError

    with pytest.raises(ConfigError, match="NAME=VALUE"):
        main(["--out", str(tmp_path), "--set", "generation.num_samples", "--summary"])
