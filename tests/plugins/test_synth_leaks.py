"""The shortcut checks: they find synth-v0's leak, and synth-v1 leaves nothing above 1/K."""

from __future__ import annotations

import pytest
from optima_task_synth import CommunicationChainTask, SyntheticChainTask
from optima_task_synth.leaks import classifier_score, strategy_scores, visible


def test_the_checks_find_the_leak_of_synth_v0_at_the_old_demo_setting() -> None:
    task = SyntheticChainTask(hops=2, num_distractors=1, style="small")
    test = visible([task.sample("test", i) for i in range(100)])
    scores = strategy_scores(test)
    assert scores["a candidate at random"] == pytest.approx(0.61)
    assert scores["a name the partner did not say"] == pytest.approx(0.765)
    train = visible([task.sample("train", i) for i in range(2000)])
    assert classifier_score(train, test) >= 0.7


@pytest.mark.slow
def test_no_shortcut_beats_one_in_k_on_ten_thousand_synth_v1_instances() -> None:
    task = CommunicationChainTask(train_size=10_000, test_size=10_000)
    limit = task.ceiling() + 0.03
    assert task.ceiling() == pytest.approx(1 / 8)
    test = visible([task.sample("test", i) for i in range(10_000)])
    assert all(len(v.candidates) == 8 for v in test)
    scores = strategy_scores(test)
    assert max(scores.values()) <= limit, scores
    train = visible([task.sample("train", i) for i in range(10_000)])
    assert classifier_score(train, test) <= limit


@pytest.mark.slow
def test_no_shortcut_beats_one_in_k_with_three_agents_more_candidates_or_more_distractors() -> None:
    for kwargs in ({"num_agents": 3}, {"num_candidates": 12, "num_rivals": 4}, {"num_distractors": 3}):
        task = CommunicationChainTask(test_size=3000, **kwargs)
        agents = kwargs.get("num_agents", 2)
        test = visible([task.sample("test", i) for i in range(3000)], agents)
        scores = strategy_scores(test)
        # 3,000 instances: the binomial sd at 1/8 is 0.006, so 0.03 is five of them
        assert max(scores.values()) <= task.ceiling() + 0.03, (kwargs, scores)
