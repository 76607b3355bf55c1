"""iSFT selection on synthetic rewards, with hand-computed expectations (spec §5 item 4, §13 items 1-2)."""

from __future__ import annotations

import pytest

from optima_env import get_plugin_manager, hookimpl
from optima_env.errors import DataError, TaskContractError
from optima_env.types import Episode, RewardBreakdown
from optima_trainers.backends import builtin as plugin
from optima_trainers.config.training import SelectionConfig
from optima_trainers.hookspecs import add_trainer_hookspecs
from optima_trainers.sft.selection import (
    best_per_instance,
    empty_selection_error,
    no_task_credit_warning,
    select_isft,
)


def ep(
    sample_id: str, total: float, *, seed: int = 0, flags: tuple[str, ...] = (), task_score: float = 0.0
) -> Episode:
    reward = RewardBreakdown(
        task=0.0, token=0.0, readability=0.0, total=total, num_tokens=10, normalizer=10.0, flags=flags
    )
    return Episode(
        task_id="t/x-v0",
        sample_id=sample_id,
        seed=seed,
        agents=("Alice", "Bob"),
        turns=(),
        final_answer=None,
        gold=("x",),
        task_score=task_score,
        terminated=False,
        truncated=True,
        end_reason="max_turns",
        num_tokens=10,
        system_prompts={},
        base_system_prompts={},
        reward=reward,
    )


# ten instances, two samples each; the best of each instance is the second sample
BEST = {
    "a": 0.95,
    "b": 0.9,
    "c": 0.85,
    "d": 0.8,
    "e": 0.7,
    "f": 0.6,
    "g": 0.55,
    "h": 0.45,
    "i": 0.3,
    "j": 0.1,
}
EPISODES = [e for sid, r in BEST.items() for e in (ep(sid, r - 0.5, seed=1), ep(sid, r, seed=2))]


def ids(episodes: list[Episode]) -> list[str]:
    return [e.sample_id for e in episodes]


def test_best_per_instance_takes_argmax_and_first_on_ties() -> None:
    best = best_per_instance([ep("a", 0.2, seed=1), ep("a", 0.7, seed=2), ep("a", 0.7, seed=3), ep("b", 0.1)])
    assert [(e.sample_id, e.seed) for e in best] == [("a", 2), ("b", 0)]


def test_code_order_top_70_percent_then_threshold() -> None:
    # sorted: a b c d e f g h i j -> top int(0.7*10)=7: a..g -> >= 0.6: a..f (f == 0.6 is kept)
    chosen = select_isft(EPISODES, SelectionConfig(theta=0.6))
    assert ids(chosen) == ["a", "b", "c", "d", "e", "f"]
    assert all(e.seed == 2 for e in chosen)


def test_paper_order_threshold_then_70_percent_of_survivors() -> None:
    # >= 0.6: a..f (6) -> top int(0.7*6)=4: a b c d
    chosen = select_isft(EPISODES, SelectionConfig(theta=0.6, order="paper"))
    assert ids(chosen) == ["a", "b", "c", "d"]


def test_orders_differ_when_threshold_binds_late() -> None:
    # theta 0.0: code keeps top 7 (a..g); paper keeps 70% of 10 survivors = 7 too
    assert ids(select_isft(EPISODES, SelectionConfig(theta=0.0))) == list("abcdefg")
    # theta 0.5: code: a..g minus none below 0.5 -> a..g; paper: 7 survivors (a..g) -> int(4.9)=4
    assert ids(select_isft(EPISODES, SelectionConfig(theta=0.5))) == list("abcdefg")
    assert ids(select_isft(EPISODES, SelectionConfig(theta=0.5, order="paper"))) == list("abcd")


def test_math_slice_drops_top_10_percent_too() -> None:
    # [int(0.1*10):int(0.8*10)] = [1:8] = b..h -> >= 0.6: b..f
    chosen = select_isft(EPISODES, SelectionConfig(theta=0.6, keep=(0.1, 0.8)))
    assert ids(chosen) == ["b", "c", "d", "e", "f"]


def test_threshold_is_on_total_reward_inclusive() -> None:
    assert ids(select_isft(EPISODES, SelectionConfig(theta=0.95, keep=(0.0, 1.0)))) == ["a"]
    assert ids(select_isft(EPISODES, SelectionConfig(theta=0.96, keep=(0.0, 1.0)))) == []


def test_impersonating_best_is_dropped_even_under_a_very_low_threshold() -> None:
    flagged = ep("k", 0.99 - 10.0, flags=("impersonation_sft",))  # the -10 is in the total already
    episodes = [*EPISODES, flagged]
    config = SelectionConfig(theta=-100.0, keep=(0.0, 1.0))
    assert "k" not in ids(select_isft(episodes, config))
    kept = select_isft(episodes, SelectionConfig(theta=-100.0, keep=(0.0, 1.0), drop_impersonation=False))
    assert ids(kept)[-1] == "k"


def test_impersonation_penalty_alone_loses_the_argmax() -> None:
    episodes = [ep("a", 0.99 - 10.0, seed=1, flags=("impersonation_sft",)), ep("a", 0.3, seed=2)]
    chosen = select_isft(episodes, SelectionConfig(theta=0.0, keep=(0.0, 1.0)))
    assert [(e.sample_id, e.seed) for e in chosen] == [("a", 2)]


def test_unscored_episode_is_an_error() -> None:
    from dataclasses import replace

    with pytest.raises(DataError, match="no reward"):
        select_isft([replace(EPISODES[0], reward=None)])


def test_bad_slice_is_rejected() -> None:
    with pytest.raises(TaskContractError, match="slice"):
        SelectionConfig(keep=(0.8, 0.1))


class OverridePlugin:
    @hookimpl
    def optima_select_training_data(self, episodes, trainer, config):
        return [e for e in episodes if e.sample_id == "j"]


class DeferPlugin:
    @hookimpl
    def optima_select_training_data(self, episodes, trainer, config):
        return None


def test_hook_builtin_is_trylast_and_can_be_overridden() -> None:
    pm = add_trainer_hookspecs(get_plugin_manager(autoload=False))  # as the trainer host does
    pm.register(plugin)
    config = SelectionConfig(theta=0.6).to_dict()
    assert ids(pm.hook.optima_select_training_data(episodes=EPISODES, trainer="isft", config=config)) == list(
        "abcdef"
    )
    pm.register(DeferPlugin())
    assert len(pm.hook.optima_select_training_data(episodes=EPISODES, trainer="isft", config=config)) == 6
    pm.register(OverridePlugin())
    chosen = pm.hook.optima_select_training_data(episodes=EPISODES, trainer="isft", config=config)
    assert ids(chosen) == ["j", "j"]


def test_min_task_score_picks_the_best_among_answers_with_some_credit() -> None:
    """With min_task_score a short wrong answer cannot win an instance over a partly right one."""
    import dataclasses

    def scored(sample_id: str, total: float, score: float, seed: int) -> Episode:
        return dataclasses.replace(ep(sample_id, total, seed=seed), task_score=score)

    episodes = [
        scored("a", 0.9, 0.0, 1),  # short and wrong: the best reward of instance a
        scored("a", 0.4, 0.3, 2),  # partly right
        scored("b", 0.8, 0.0, 1),  # instance b has no answer with credit at all
        scored("c", 0.7, 1.0, 1),
    ]
    plain = select_isft(episodes, SelectionConfig(theta=-100, keep=(0.0, 1.0)))
    assert [(e.sample_id, e.seed) for e in plain] == [("a", 1), ("b", 1), ("c", 1)]
    config = SelectionConfig(theta=-100, keep=(0.0, 1.0), min_task_score=1e-9)
    assert [(e.sample_id, e.seed) for e in select_isft(episodes, config)] == [("c", 1), ("a", 2)]
    assert SelectionConfig.from_mapping(config.to_dict()) == config


def test_an_empty_selection_suggests_keeping_task_credit_first_and_that_suggestion_works() -> None:
    """A new task: the best total reward (0.07) got the task wrong; three instances have a
    trajectory with task credit, at lower totals. The error's first lever keeps credited
    trajectories only; lowering θ alone keeps wrong ones, and that selection warns with its counts."""
    episodes = [
        ep("a", 0.07), ep("a", 0.045, seed=1, task_score=0.5),
        ep("b", 0.06), ep("b", 0.03, seed=1, task_score=1.0),
        ep("c", 0.065), ep("c", 0.021, seed=1, task_score=0.2),
        ep("d", -0.2), ep("e", -0.3),
    ]  # fmt: skip
    assert select_isft(episodes, SelectionConfig(theta=0.5)) == []
    line = str(empty_selection_error(episodes, {**SelectionConfig().to_dict(), "stage": "iter_00"}))
    first, lower = "--min-task-score 1e-09 --theta-sft 0.02", "--theta-sft 0.07"
    assert first in line and lower in line and line.index(first) < line.index(lower), line
    assert "(here it keeps 2 trajectories, all with task credit)" in line
    credited = select_isft(episodes, SelectionConfig(theta=0.02, min_task_score=1e-9))
    assert [(e.sample_id, e.task_score) for e in credited] == [("a", 0.5), ("b", 1.0)]
    assert no_task_credit_warning(credited, "iter_00") is None
    noise = select_isft(episodes, SelectionConfig(theta=0.06))
    assert [(e.sample_id, e.task_score) for e in noise] == [("a", 0.0), ("c", 0.0), ("b", 0.0)]
    warning = no_task_credit_warning(noise, "iter_00")
    assert warning is not None and "kept 3 trajectories, of which 3 have task score 0" in warning


def test_an_empty_selection_with_too_few_credited_instances_says_so() -> None:
    episodes = [ep("a", 0.07), ep("a", 0.045, seed=1, task_score=0.5), ep("b", 0.06)]
    line = str(empty_selection_error(episodes, {**SelectionConfig().to_dict(), "stage": "iter_00"}))
    assert "Only 1 instance(s) have a trajectory with task credit, too few for the kept slice" in line


def test_an_empty_selection_without_any_task_credit_says_min_task_score_cannot_help() -> None:
    episodes = [ep("a", 0.07), ep("b", -0.2)]
    line = str(empty_selection_error(episodes, {**SelectionConfig().to_dict(), "stage": "iter_00"}))
    assert "No trajectory scored above 0 on the task, so --min-task-score would keep none" in line
    assert "--theta-sft 0.07" in line and "would train on task score 0" in line


def test_the_task_credit_warning_counts_and_stays_quiet_at_half() -> None:
    half = [ep("a", 0.9, task_score=1.0), ep("b", 0.6)]
    assert no_task_credit_warning(half, "iter_01") is None
    most = [*half, ep("c", 0.55)]
    warning = no_task_credit_warning(most, "iter_01")
    assert warning is not None and "'iter_01'" in warning
    assert "kept 3 trajectories, of which 2 have task score 0" in warning
