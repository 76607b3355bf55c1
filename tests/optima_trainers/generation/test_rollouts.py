"""Resumable rollouts (scripted policy): finished episodes are reloaded, only missing jobs are played."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optima_env import make_task
from optima_env.episode_scorer import EpisodeScorer
from optima_env.errors import DataError
from optima_env.policy import GenerationRequest, SamplingParams, ScriptedPolicy
from optima_env.reward import RewardConfig
from optima_env.rollout import make_jobs
from optima_trainers.generation.rollouts import resumable_rollout


def reply(request: GenerationRequest) -> str:
    seed, turn = request.key
    return "<A>Tavo</A>" if (seed + turn) % 3 == 0 and turn else f"fact {seed % 89} at turn {turn}"


def play(path: Path, jobs, played: list) -> list:
    def recording(request: GenerationRequest) -> str:
        played.append(request.key[0])
        return reply(request)

    return resumable_rollout(
        make_task("ie/synth-v0"),
        ScriptedPolicy(recording),
        jobs=jobs,
        path=path,
        sampling=SamplingParams(),
        env_kwargs={"max_turns": 4},
        concurrency=3,
        progress=False,
    )


def test_resume_plays_only_the_missing_jobs_and_drops_a_torn_line(tmp_path: Path) -> None:
    jobs = make_jobs(range(4), num_samples=2, seed=5)
    full = play(tmp_path / "full.jsonl", jobs, [])
    assert [tuple(e.metadata["job"]) for e in full] == [(j.index, j.sample) for j in jobs]

    lines = (tmp_path / "full.jsonl").read_text().splitlines(keepends=True)
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(lines[:3]) + lines[3][:40])  # 3 finished episodes and a torn 4th
    played: list = []
    resumed = play(partial, jobs, played)
    assert resumed == full
    finished = {json.loads(x)["seed"] for x in lines[:3]}
    assert finished and not finished & set(played)  # the three finished episodes were not replayed
    assert len(partial.read_text().splitlines()) == len(jobs)


def test_a_duplicated_job_is_reported(tmp_path: Path) -> None:
    jobs = make_jobs(range(2), num_samples=1, seed=1)
    play(tmp_path / "e.jsonl", jobs, [])
    first = (tmp_path / "e.jsonl").read_text().splitlines(keepends=True)[0]
    with open(tmp_path / "e.jsonl", "a") as handle:
        handle.write(first)
    with pytest.raises(DataError, match="appears twice"):
        play(tmp_path / "e.jsonl", jobs, [])


def test_scoring_groups_by_instance_and_keeps_order(tmp_path: Path) -> None:
    episodes = play(tmp_path / "e.jsonl", make_jobs(range(3), num_samples=2, seed=2), [])
    scored = EpisodeScorer(RewardConfig()).score(episodes)  # the per-instance group max
    assert [e.sample_id for e in scored] == [e.sample_id for e in episodes]
    for sample_id in {e.sample_id for e in episodes}:
        group = [e for e in scored if e.sample_id == sample_id]
        longest = max(e.num_tokens for e in group)
        assert all(e.reward.normalizer == longest for e in group)


def test_the_prompt_budget_is_the_running_engines_context_less_the_turn_cap(tmp_path: Path) -> None:
    """A running engine's own context (a vLLM engine's ``max_model_len``) comes first; otherwise
    ``generation.max_model_len``, else the starting model's config; no chat tokenizer, no budget."""
    pytest.importorskip("transformers")
    from optima_env.models import load_tokenizer, resolve_model_path
    from optima_trainers import IterativeTrainer, RunDir, resolve_config

    tokenizer = load_tokenizer(resolve_model_path("embedded"))

    class Engine:
        def __init__(self, tokenizer, max_model_len=None):
            self.tokenizer = tokenizer
            if max_model_len is not None:
                self.max_model_len = max_model_len

    budgets = []
    for name, overrides in (("model", {}), ("set", {"generation.max_model_len": 2048})):
        config = resolve_config("ie/synth-v0", "isft", profile="cpu",
                                overrides={"generation.max_new_tokens": 100, **overrides})  # fmt: skip
        run_dir = RunDir.create(config, run_dir=tmp_path / name)
        trainer = IterativeTrainer(config, run_dir=run_dir, progress=False)
        engines = (Engine(tokenizer, 1024), Engine(tokenizer), Engine(None))
        budgets.append([trainer.generation._prompt_budget(engine) for engine in engines])
    assert budgets == [[924, 8192 - 100, None], [924, 2048 - 100, None]]
