"""The configuration tree: task presets (spec §5-§7 tables, §13 items 5-6), profiles, validation."""

from __future__ import annotations

import json
import logging

import pytest

from optima_env import TaskSpec, get_plugin_manager
from optima_env.configtree import ConfigError
from optima_trainers.config.train import TrainConfig, resolve_config
from optima_trainers.host.loop import plan_stages
from tests.helpers import TinyTask as ToyTask


def test_isft_code_and_paper_presets_differ_where_the_spec_says() -> None:
    code = resolve_config("ie/triviaqa-v0", "isft", profile="paper-full")
    paper = resolve_config("ie/triviaqa-v0", "isft", preset="paper", profile="paper-full")
    assert (code.selection.theta, paper.selection.theta) == (0.5, 0.6)  # Table 8 vs recipe
    math_code = resolve_config("debate/math-v0", "isft", profile="paper-full")
    math_paper = resolve_config("debate/math-v0", "isft", preset="paper", profile="paper-full")
    assert (math_code.reward.lambda_loss, math_paper.reward.lambda_loss) == (0.8, 0.9)
    assert math_code.selection.keep == (0.1, 0.8) and math_code.sft.restart_from_base
    assert math_code.generation.init_temperature == 0.7 and math_code.family == "debate"
    assert (math_code.sft.learning_rate, math_code.sft.epochs, math_code.generation.instances) == (
        1e-6,
        3,
        7500,
    )


def test_idpo_and_isft_dpo_presets() -> None:
    gsm = resolve_config("debate/gsm8k-v0", "idpo", profile="paper-full")
    assert (gsm.dpo.beta, gsm.tree.theta_filter, gsm.dpo.rpo_alpha, gsm.tree.normalizer_percentile) == (
        0.25,
        0.5,
        1.0,
        85.0,
    )
    assert (
        gsm.tree_reward.lambda_token,
        gsm.tree_reward.lambda_loss,
        gsm.iterations,
        gsm.tree.instances,
    ) == (
        0.6,
        0.7,
        5,
        7000,
    )
    assert (gsm.reward.lambda_token, gsm.reward.lambda_loss) == (0.4, 0.9)  # the iSFT initialization
    assert gsm.tree_reward.impersonation == "mcts" and gsm.reward.impersonation == "sft"
    arc = resolve_config("debate/arc_challenge-v0", "idpo", profile="paper-full")
    assert arc.iterations == 2 and arc.generation.num_samples == 15 and arc.generation.init_temperature == 0.3
    assert resolve_config("debate/arc_challenge-v0", "idpo", preset="paper", profile="paper-full").iterations == 5
    hotpot = resolve_config("ie/hotpotqa-v0", "isft-dpo", profile="paper-full")
    hotpot_paper = resolve_config("ie/hotpotqa-v0", "isft-dpo", preset="paper", profile="paper-full")
    assert (hotpot.dpo.beta, hotpot_paper.dpo.beta) == (0.1, 0.5)
    assert hotpot.dpo.rpo_alpha is None and hotpot.tree.normalizer_percentile == 80.0
    assert (hotpot.sft.epochs, hotpot.generation.instances, hotpot.tree.instances, hotpot.iterations) == (
        2,
        10000,
        12000,
        3,
    )
    mmlu = resolve_config("debate/mmlu-v0", "isft-dpo", profile="paper-full")
    assert (mmlu.selection.theta, mmlu.tree.theta_filter) == (0.7, 0.45)


def test_cpu_profile_sizes_and_overrides() -> None:
    config = resolve_config("ie/synth-v0", "isft", profile="cpu", iterations=3)
    assert config.sft.lora and config.dpo.lora and config.iterations == 3
    assert (config.generation.instances, config.generation.num_samples) == (6, 3)
    assert config.generation.stop_at_speaker_tags and config.selection.theta == -0.5
    assert resolve_config("ie/synth-v0", "isft", profile="cpu").iterations == 2  # the trainer's cpu value
    paper = resolve_config("ie/hotpotqa-v0", "isft", profile="paper-full")
    assert (
        not paper.sft.lora and not paper.generation.stop_at_speaker_tags and paper.generation.max_turns == 10
    )
    assert paper.generation.max_new_tokens == 2000 and paper.sft.eval_fraction == 0.02


def test_typed_overrides_by_dotted_name() -> None:
    config = resolve_config(
        "ie/synth-v0",
        "isft",
        overrides={"reward.lambda_token": "0.4", "sft.lora": "false", "selection.keep": "0.1,0.9"},
    )
    assert (
        config.reward.lambda_token == 0.4 and config.sft.lora is False and config.selection.keep == (0.1, 0.9)
    )
    assert config.replace(**{"tree.lambda_loss": 2}).tree_reward.lambda_loss == 2.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"reward.lambda_token": -0.5}, "lambda_token must be a number >= 0, got -0.5"),
        ({"reward.lambda_loss": "nan"}, "lambda_loss"),
        ({"selection.theta": "high"}, "config field 'selection.theta': expected a number"),
        ({"selection.theta": float("inf")}, "selection.theta must be a finite number"),
        ({"tree.theta_filter": "x"}, "config field 'tree.theta_filter': expected a number"),
        ({"sft.learning_rate": 0}, "sft.learning_rate must lie in (0, 1)"),
        ({"dpo.beta": 0}, "beta must be > 0"),
        (
            {"reward.lamda_token": 1},
            "unknown config field 'reward.lamda_token'; did you mean reward.lambda_token",
        ),
        ({"sft": 1}, "is a section"),
        ({"generation.backend": "tpu"}, "expected one of 'hf', 'vllm', 'openai'"),
        ({"generation.backend": "ct2"}, "expected one of 'hf', 'vllm', 'openai', got 'ct2'"),
        ({"generation.num_samples": 2.5}, "expected an int"),
    ],
)
def test_bad_values_are_refused_when_the_config_is_built(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_config("ie/synth-v0", "isft", overrides=overrides)
    assert message in str(info.value)


def test_a_task_without_presets_gets_the_generic_defaults_with_a_notice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pm = get_plugin_manager()
    (trainer,) = [s for s in pm.hook.optima_register_trainers() for s in s if s.name == "isft"]
    spec = TaskSpec(id="acme/riddles-v0", factory=ToyTask, family="debate")
    with caplog.at_level(logging.WARNING):
        config = resolve_config(spec, trainer, profile="paper-full")
    assert "has no 'code' preset for trainer 'isft'" in caplog.text and "generic defaults" in caplog.text
    defaults = TrainConfig(task="x", trainer="isft")
    assert config.reward == defaults.reward and config.selection == defaults.selection
    assert config.sft.learning_rate == defaults.sft.learning_rate
    assert config.sft.restart_from_base  # debate: SFT restarts from the base model (spec §5 item 8)
    # and not the presets of a task whose name it happens to contain
    named = TaskSpec(id="acme/hotpotqa_like-v0", factory=ToyTask, family="information_exchange")
    assert (
        resolve_config(named, trainer, profile="paper-full").generation.num_samples
        == defaults.generation.num_samples
    )


def test_a_task_sets_its_own_reward_thresholds() -> None:
    pm = get_plugin_manager()
    (trainer,) = [s for s in pm.hook.optima_register_trainers() for s in s if s.name == "idpo"]
    spec = TaskSpec(
        id="acme/short-v0",
        factory=ToyTask,
        family="information_exchange",
        reward={"short_trajectory_tokens": 5, "repeated_turn_zero_loss": False},
    )
    config = resolve_config(spec, trainer)
    for reward in (config.reward, config.tree_reward):
        assert reward.short_trajectory_tokens == 5 and not reward.repeated_turn_zero_loss
    assert resolve_config(spec, trainer, reward_preset="paper").reward.short_trajectory_tokens is None


def test_config_round_trips_through_json() -> None:
    config = resolve_config(
        "ie/synth-v0", "idpo", task_kwargs={"hops": 3}, overrides={"selection.keep": (0.2, 0.6)}
    )
    again = TrainConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config and again.selection.keep == (0.2, 0.6)
    with pytest.raises(ConfigError, match=r"unknown config field 'sft\.bogus'"):
        TrainConfig.from_dict({**config.to_dict(), "sft": {**config.to_dict()["sft"], "bogus": 1}})


def test_the_retired_ctranslate2_settings_are_refused() -> None:
    """``generation.backend="ct2"`` and ``generation.compute_type`` (CTranslate2's weight type) are
    gone: a config holding them fails when it is built (a stored run of that era gets run folder
    format 1's error, tests/optima_trainers/run/test_folder_and_checkpoint.py)."""
    stored = resolve_config("ie/synth-v0", "isft").to_dict()
    stored["generation"]["backend"] = "ct2"
    with pytest.raises(ConfigError, match="expected one of 'hf', 'vllm', 'openai', got 'ct2'"):
        TrainConfig.from_dict(stored)
    with pytest.raises(ConfigError, match=r"unknown config field 'generation\.compute_type'"):
        resolve_config("ie/synth-v0", "isft", overrides={"generation.compute_type": "int8"})


def test_stage_plans() -> None:
    def names(trainer: str, k: int) -> list[str]:
        return [s.name for s in plan_stages(resolve_config("ie/synth-v0", trainer, iterations=k))]

    assert names("isft", 3) == ["iter_00", "iter_01", "iter_02"]
    assert names("idpo", 2) == ["iter_00", "iter_01", "iter_02"]
    assert names("isft-dpo", 2) == ["iter_00_sft", "iter_00_dpo", "iter_01_sft", "iter_01_dpo"]
    stages = plan_stages(resolve_config("ie/synth-v0", "idpo", iterations=2))
    assert [(s.kind, s.generate, s.start) for s in stages] == [
        ("sft", "samples", "base"),
        ("dpo", "tree", "previous"),
        ("dpo", "tree", "previous"),
    ]
    debate = plan_stages(resolve_config("debate/gsm8k-v0", "isft", iterations=2))
    assert [s.start for s in debate] == ["base", "base"]  # debate SFT restarts from the base model
