"""The embedded model, for real: SmolLM2-135M-Instruct plays the embedded task (slow)."""

from __future__ import annotations

import math

import pytest

from optima_env import RewardConfig, make_task
from optima_env.policy import SamplingParams
from optima_env.readability import TransformersLMLoss, episode_lm_losses
from optima_env.rollout import make_jobs, rollout

pytestmark = pytest.mark.slow


def test_embedded_model_plays_two_short_episodes(embedded) -> None:
    from optima_env.backends.hf import TransformersPolicy

    model, tokenizer = embedded
    policy = TransformersPolicy(model, tokenizer, batch_size=2)
    scorer = TransformersLMLoss(model, tokenizer)
    task = make_task("ie/synth-v0")
    episodes = rollout(
        task,
        policy,
        jobs=make_jobs(range(2), num_samples=1, seed=0),
        sampling=SamplingParams(temperature=0.0, max_new_tokens=24, seed=0),
        env_kwargs=dict(
            split="test", max_turns=4, tokenizer=tokenizer, readability=scorer, reward_config=RewardConfig()
        ),
    )
    assert len(episodes) == 2
    for ep in episodes:
        assert ep.num_tokens > 0
        assert [t.agent for t in ep.turns] == ["Alice", "Bob", "Alice", "Bob"][: len(ep.turns)]
        assert all(t.text.startswith(f"{t.agent}:") for t in ep.turns)
        assert all(t.num_tokens == len(tokenizer.tokenize(t.text)) for t in ep.turns)
        assert ep.reward is not None and math.isfinite(ep.reward.total)
        assert ep.lm_loss is not None and ep.lm_loss > 0
        assert ep.reward.readability == pytest.approx(1.0 / ep.lm_loss) or ep.reward.flags


def test_lm_loss_scores_content_tokens_only_and_prefers_fluent_text(embedded) -> None:
    model, tokenizer = embedded
    scorer = TransformersLMLoss(model, tokenizer, max_batch_tokens=64)
    fluent = "Alice: The capital of France is Paris."
    garbled = "Alice: Paris capital the France of is zq xv."
    losses = scorer([fluent, garbled, fluent])
    assert losses[0] == pytest.approx(losses[2], rel=1e-5)  # batching/padding does not change a loss
    assert losses[0] < losses[1]
    alone = scorer([fluent])[0]
    assert alone == pytest.approx(losses[0], rel=1e-4)
    assert episode_lm_losses(scorer, [[fluent, garbled], []]) == [
        pytest.approx(max(losses[:2]), rel=1e-4),
        None,
    ]
