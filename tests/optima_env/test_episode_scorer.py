"""The one episode scorer: readability, token normalizer, reward and the scored event."""

from __future__ import annotations

import dataclasses

import pytest

from optima_env import EpisodeScorer, RewardConfig, ScoringError, score_group
from optima_env.reward import score_episode
from tests.optima_env.test_reward import episode

CONFIG = RewardConfig(short_trajectory_tokens=None)


def losses_by_length(texts):
    return [1.0 + len(t) / 10 for t in texts]


def test_group_normalizer_is_each_instances_max_and_equals_score_group() -> None:
    a = [episode(["hi", "yo"], tokens=[40, 20], sample_id="a"), episode(["x"], tokens=[90], sample_id="a")]
    b = [episode(["hello there"], tokens=[50], sample_id="b")]
    scored = EpisodeScorer(CONFIG).score([a[0], b[0], a[1]])  # instances interleaved, order kept
    assert [e.sample_id for e in scored] == ["a", "b", "a"]
    assert [e.reward.normalizer for e in scored] == [90.0, 50.0, 90.0]
    assert [scored[0].reward, scored[2].reward] == [e.reward for e in score_group(a, config=CONFIG)]


def test_a_shard_scored_against_the_whole_group_gets_the_normalizers_of_scoring_everything() -> None:
    a = [episode(["hi"], tokens=[40], sample_id="a"), episode(["x"], tokens=[90], sample_id="a")]
    b = [episode(["hello there"], tokens=[50], sample_id="b")]
    everything = EpisodeScorer(CONFIG, readability=losses_by_length).score([*a, *b])
    shard = EpisodeScorer(CONFIG, readability=losses_by_length).score([a[0], b[0]], group=[*a, *b])
    assert shard == [everything[0], everything[2]]  # a[0]'s normalizer is 90, from a[1] on another shard
    assert shard[0].reward.normalizer == 90.0
    with pytest.raises(ScoringError, match="normalizer='group'"):
        EpisodeScorer(CONFIG, normalizer=50.0).score([a[0]], group=a)


def test_readability_sets_lm_loss_as_the_max_turn_loss_and_feeds_the_reward() -> None:
    e = episode(["Alice: short", "Bob: a much longer turn"], lm_loss=None)
    (scored,) = EpisodeScorer(CONFIG, readability=losses_by_length, normalizer=100.0).score([e])
    assert scored.lm_loss == max(losses_by_length([t.text for t in e.turns]))
    expected = score_episode(scored, config=CONFIG, normalizer=100.0)
    assert scored.reward == expected and scored.reward.readability == pytest.approx(1.0 / scored.lm_loss)


def test_cached_turns_are_scored_once_across_calls_uncached_ones_every_call() -> None:
    calls: list[list[str]] = []

    def scorer(texts):
        calls.append(list(texts))
        return losses_by_length(texts)

    e = episode(["Alice: same", "Bob: same too"], lm_loss=None)
    cached = EpisodeScorer(CONFIG, readability=scorer, normalizer=50.0, cache_turns=True)
    first, second = cached.score([e, e]), cached.score([e])
    assert calls == [sorted({"Alice: same", "Bob: same too"})]  # one call, each text once
    assert first[0].reward == second[0].reward
    calls.clear()
    plain = EpisodeScorer(CONFIG, readability=scorer, normalizer=50.0)
    plain.score([e, e])
    assert calls == [["Alice: same", "Bob: same too"] * 2]  # in order, duplicates included
    assert plain.score([e])[0].reward == first[0].reward


def test_running_normalizer_is_the_instances_max_so_far() -> None:
    short, long = episode(["a"], tokens=[30]), episode(["b"], tokens=[80])
    scorer = EpisodeScorer(CONFIG, normalizer="running")
    assert scorer.score([short])[0].reward.normalizer == 30.0
    assert [e.reward.normalizer for e in scorer.score([long, short])] == [80.0, 80.0]
    assert scorer.score([short])[0].reward.normalizer == 80.0  # the tree's max stays


def test_the_scored_event_fires_once_per_episode_in_order() -> None:
    seen = []
    eps = [episode(["a"], sample_id="x"), episode(["b"], sample_id="y")]
    scored = EpisodeScorer(CONFIG, on_scored=seen.append).score(eps)
    assert seen == scored and [s.reward.total for s in scored] == EpisodeScorer(CONFIG)(eps)


@pytest.mark.parametrize("bad", [0, -1.0, "max", True])
def test_a_bad_normalizer_is_refused(bad) -> None:
    with pytest.raises(ScoringError, match="normalizer must be"):
        EpisodeScorer(CONFIG, normalizer=bad)


@pytest.mark.parametrize("scoring", [True, False])
def test_the_env_scores_its_episodes_with_the_same_scorer_as_the_trainers(scoring) -> None:
    """ConversationEnv's own reward (constant normalizer) is EpisodeScorer's, turn losses included,
    down to the truncated-turn rule that reads per-turn losses; without scoring it still fills lm_loss."""
    from optima_env import ConversationEnv, ScriptedPolicy, make_task
    from optima_env.rollout import run_episode

    task = make_task("ie/synth-v0")
    turns = ["Alice: I hold the key fact.", "Bob: " + "long " * 80, "Alice: <A>red</A>", "Bob: <A>red</A>"]
    config = RewardConfig(lambda_token=0.4)
    env = ConversationEnv(
        task, reward_config=config, readability=losses_by_length, token_normalizer=300.0, scoring=scoring,
        turn_token_cap=64,
    )  # fmt: skip
    played = run_episode(env, ScriptedPolicy.from_turns(turns), seed=5)
    plain = dataclasses.replace(played, lm_loss=None, reward=None)
    expected = EpisodeScorer(config, readability=losses_by_length, normalizer=300.0)
    assert played.lm_loss == max(losses_by_length([t.text for t in played.turns]))
    if scoring:
        assert played.reward == expected.score([plain])[0].reward
        assert played.reward.normalizer == 300.0 and played.reward.token != 0.0
    else:
        assert played.reward is None
