"""What the vLLM run tests share (``test_vllm.py``'s in-place run, ``test_vllm_lora.py``'s
base + adapters run): the run's sizes, and a stage replayed on a fresh in-place engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

RUN_SIZES = {"generation.backend": "vllm", "generation.vllm_gpu_memory_utilization": 0.2,
             "generation.max_model_len": 1024, "generation.instances": 2, "generation.num_samples": 2,
             "generation.max_turns": 2, "generation.max_new_tokens": 8, "generation.concurrency": 4,
             "sft.max_steps": 1, "dpo.max_steps": 1, "selection.theta": -100.0,
             "tree.normalizer_instances": 2, "tree.instances": 2, "tree.selections": 2, "tree.rollouts": 2,
             "tree.theta_filter": -100.0, "tree.theta_diff": 0.0}  # fmt: skip
"""A 4-stage iSFT-DPO run on the tiny model, small enough for vLLM-CPU in a test."""


def replay_stage(trainer: Any, run: Path, stage: str, checkpoint: Path) -> tuple[list[Any], list[Any]]:
    """``(stored, replayed)``: the episodes the run stored for the sampled ``stage``, and the same
    jobs and seeds played again by a fresh vLLM engine holding ``checkpoint``'s merged weights."""
    from optima_env.backends.loading import load_policy
    from optima_env.io import read_episodes
    from optima_env.policy import SamplingParams
    from optima_env.registry import get_plugin_manager
    from optima_env.rollout import make_jobs, rollout
    from optima_trainers.run.stages import stage_seed

    config = trainer.config
    stored = read_episodes(run / stage / "episodes.jsonl")
    fresh = load_policy(str(checkpoint), backend="vllm", dtype="float32",
                        max_model_len=1024, gpu_memory_utilization=0.2)  # fmt: skip
    try:
        gen, seed = config.generation, stage_seed(config.seed, stage)
        env = trainer.generation._env(fresh).kwargs(gen, split=config.split)
        replay = rollout(
            trainer.task,
            fresh,
            jobs=make_jobs(sorted({e.metadata["job"][0] for e in stored}), gen.num_samples, seed),
            sampling=SamplingParams(temperature=gen.temperature, top_p=gen.top_p,
                                    max_new_tokens=gen.max_new_tokens, seed=seed,
                                    stop=gen.stops(trainer.task.agents)),
            env_kwargs={**env, "pm": get_plugin_manager()},
            concurrency=gen.concurrency,
            reset_options=lambda job: {"index": job.index % trainer.generation.num_train},
        )  # fmt: skip
    finally:
        fresh.close()
    return stored, replay
