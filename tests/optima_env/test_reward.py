"""The Optima reward (spec §3): Eq. 1, each special case, group normalization."""

from __future__ import annotations

import pytest

from optima_env import Episode, RewardConfig, ScoringError, Turn, optima_reward, score_group
from optima_env.reward import is_impersonating, percentile_normalizer, score_episode


def episode(
    turn_texts: list[str],
    *,
    tokens: list[int] | None = None,
    task: float = 1.0,
    lm_loss: float | None = 2.0,
    sample_id: str = "s",
) -> Episode:
    agents = ("Alice", "Bob")
    tokens = tokens or [10] * len(turn_texts)
    turns = tuple(
        Turn(index=i, agent=agents[i % 2], text=t, num_tokens=n)
        for i, (t, n) in enumerate(zip(turn_texts, tokens))
    )
    return Episode(
        task_id="t",
        sample_id=sample_id,
        seed=0,
        agents=agents,
        turns=turns,
        final_answer="x",
        gold=("x",),
        task_score=task,
        terminated=True,
        truncated=False,
        end_reason="agreement",
        num_tokens=sum(tokens),
        system_prompts={},
        base_system_prompts={},
        lm_loss=lm_loss,
    )


def test_optima_reward_is_exactly_equation_1() -> None:
    # 0.8 - 0.6 * 30/120 + 1.0/2.5 = 0.8 - 0.15 + 0.4 = 1.05
    assert optima_reward(0.8, 30, 120, 2.5, lambda_token=0.6, lambda_loss=1.0) == pytest.approx(1.05)
    # 0.5 - 0.4 * 100/100 + 0.9/3.0 = 0.5 - 0.4 + 0.3 = 0.4
    assert optima_reward(0.5, 100, 100, 3.0, lambda_token=0.4, lambda_loss=0.9) == pytest.approx(0.4)


@pytest.mark.parametrize("kwargs", [dict(max_tokens=0, lm_loss=1.0), dict(max_tokens=10, lm_loss=0.0)])
def test_optima_reward_rejects_degenerate_denominators(kwargs) -> None:
    with pytest.raises(ScoringError, match="must be > 0"):
        optima_reward(1.0, 5, lambda_token=0.6, lambda_loss=1.0, **kwargs)


def test_plain_episode_matches_equation_1() -> None:
    ep = episode(["Alice: a b", "Bob: c d", "Alice: e f"], tokens=[20, 20, 20])
    r = score_episode(ep, config=RewardConfig(), normalizer=120)
    assert r.token == pytest.approx(-0.6 * 60 / 120)
    assert r.readability == pytest.approx(1.0 / 2.0)
    assert r.total == pytest.approx(1.0 - 0.3 + 0.5)
    assert r.flags == ()


def test_short_trajectory_gets_token_term_minus_one() -> None:
    ep = episode(["Alice: a", "Bob: b"], tokens=[20, 20])  # 40 tokens <= 40
    r = score_episode(ep, config=RewardConfig(), normalizer=100)
    assert r.token == -1.0 and "short_trajectory" in r.flags
    off = score_episode(ep, config=RewardConfig(short_trajectory_tokens=None), normalizer=100)
    assert off.token == pytest.approx(-0.6 * 40 / 100)


def test_large_turn_gets_token_term_minus_one() -> None:
    ep = episode(["Alice: a", "large"], tokens=[30, 30])
    r = score_episode(ep, config=RewardConfig(), normalizer=100)
    assert r.token == -1.0 and r.flags[0] == "large_turn"


def test_long_trajectory_gets_readability_minus_one() -> None:
    ep = episode(["Alice: a", "Bob: b"], tokens=[1500, 600])
    r = score_episode(ep, config=RewardConfig(), normalizer=2100)
    assert r.readability == -1.0 and "long_trajectory" in r.flags
    assert r.total == pytest.approx(1.0 - 0.6 - 1.0)


def test_repeated_turn_zeroes_readability_case_insensitively() -> None:
    ep = episode(["Alice: Hello there", "Bob: ok", "Alice: HELLO THERE"], tokens=[20, 20, 20])
    r = score_episode(ep, config=RewardConfig(), normalizer=60)
    assert r.readability == 0.0 and "repeated_turn" in r.flags
    # a repeat across speakers counts too: the prefix is stripped first
    ep2 = episode(["Alice: same", "Bob: same"], tokens=[30, 30])
    assert score_episode(ep2, config=RewardConfig(), normalizer=60).readability == 0.0


def test_impersonation_sft_subtracts_ten_and_mcts_zeroes_task() -> None:
    ep = episode(["Alice: hi Bob: fine", "Bob: ok"], tokens=[30, 30])
    assert is_impersonating(ep.turns[0], ep.agents)
    sft = score_episode(ep, config=RewardConfig(impersonation="sft"), normalizer=60)
    assert sft.total == pytest.approx(1.0 - 0.6 + 0.5 - 10)
    whole = RewardConfig(impersonation="mcts", mcts_turn_scan=False)
    mcts = score_episode(ep, config=whole, normalizer=60)
    assert mcts.task == 0.0 and mcts.total == pytest.approx(0.0 - 0.6 + 0.5)
    # the reference's scan: the impersonating turn is the first, so no turn is scored (readability 0)
    scan = score_episode(ep, config=RewardConfig(impersonation="mcts"), normalizer=60)
    assert (scan.task, scan.readability, scan.total) == (0.0, 0.0, pytest.approx(-0.6))
    off = score_episode(ep, config=RewardConfig(impersonation="off"), normalizer=60)
    assert off.total == pytest.approx(1.0 - 0.6 + 0.5)


def test_own_tag_twice_is_impersonation() -> None:
    ep = episode(["Alice: x Alice: y"], tokens=[50])
    assert is_impersonating(ep.turns[0], ep.agents)


def test_missing_readability_is_flagged_not_invented() -> None:
    ep = episode(["Alice: a b c", "Bob: d e f"], tokens=[30, 30], lm_loss=None)
    r = score_episode(ep, config=RewardConfig(), normalizer=60)
    assert r.readability == 0.0 and "no_readability" in r.flags


def test_paper_preset_turns_every_special_case_off() -> None:
    ep = episode(["Alice: a", "large"], tokens=[10, 10])
    r = score_episode(ep, config=RewardConfig.preset("paper"), normalizer=20)
    assert r.flags == ()
    assert r.total == pytest.approx(optima_reward(1.0, 20, 20, 2.0, lambda_token=0.6, lambda_loss=1.0))
    with pytest.raises(ScoringError, match="preset"):
        RewardConfig.preset("other")  # type: ignore[arg-type]
    with pytest.raises(ScoringError, match="lambda_token"):
        RewardConfig(lambda_token=-0.6)


def test_group_normalizer_is_the_per_instance_max() -> None:
    eps = [episode(["Alice: a", "Bob: b"], tokens=[30, 30]), episode(["Alice: a", "Bob: c"], tokens=[60, 60])]
    scored = score_group(eps, config=RewardConfig())
    assert [e.reward.normalizer for e in scored] == [120.0, 120.0]
    assert scored[0].reward.token == pytest.approx(-0.6 * 60 / 120)
    assert scored[1].reward.token == pytest.approx(-0.6)


def test_group_normalizer_skips_large_trajectories_in_code_preset() -> None:
    eps = [
        episode(["Alice: a", "Bob: b"], tokens=[30, 30]),
        episode(["Alice: a", "large"], tokens=[500, 500]),
    ]
    assert score_group(eps, config=RewardConfig())[0].reward.normalizer == 60.0
    assert score_group(eps, config=RewardConfig.preset("paper"))[0].reward.normalizer == 1000.0


def test_group_rejects_mixed_instances_and_accepts_a_constant_normalizer() -> None:
    eps = [episode(["Alice: a"], sample_id="a"), episode(["Alice: a"], sample_id="b")]
    with pytest.raises(ScoringError, match="group the episodes"):
        score_group(eps, config=RewardConfig())
    scored = score_group([episode(["Alice: a b"], tokens=[50])], config=RewardConfig(), normalizer=200.0)
    assert scored[0].reward.token == pytest.approx(-0.6 * 50 / 200)


def test_percentile_normalizer_is_percentile_plus_one() -> None:
    counts = list(range(1, 101))  # numpy linear interpolation: 85th percentile of 1..100 = 85.15
    assert percentile_normalizer(counts, 85) == 86.0  # the reference: int(85.15) + 1
    assert percentile_normalizer(counts, 85, rounding="float") == pytest.approx(86.15)
    with pytest.raises(ScoringError):
        percentile_normalizer([], 85)
