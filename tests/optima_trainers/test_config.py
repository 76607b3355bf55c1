"""Presets (spec §5-§7 tables, §13 items 5-6), profiles and the stage plan."""

from __future__ import annotations

import pytest

from optima_env.errors import TaskContractError
from optima_trainers.config import TrainConfig, preset_key, resolve_config
from optima_trainers.loop import plan_stages


@pytest.mark.parametrize(
    ("task_id", "key"),
    [
        ("ie/hotpotqa-v0", "hotpotqa"),
        ("ie/2wikimultihopqa-v0", "2wmh"),
        ("ie/triviaqa-v0", "triviaqa"),
        ("ie/cbt-v0", "cbt"),
        ("debate/math-v0", "math"),
        ("debate/gsm8k-v0", "gsm8k"),
        ("debate/arc_challenge-v0", "arc"),
        ("debate/mmlu-v0", "mmlu"),
        ("ie/synth-v0", "synth"),
        ("acme/unknown-v3", None),
    ],
)
def test_preset_keys_of_the_registered_tasks(task_id: str, key: str | None) -> None:
    assert preset_key(task_id) == key


def test_isft_code_and_paper_presets_differ_where_the_spec_says() -> None:
    code = resolve_config("ie/triviaqa-v0", "isft", profile="paper")
    paper = resolve_config("ie/triviaqa-v0", "isft", preset="paper", profile="paper")
    assert (code.theta_sft, paper.theta_sft) == (0.5, 0.6)
    math_code = resolve_config("debate/math-v0", "isft", profile="paper", family="debate")
    math_paper = resolve_config("debate/math-v0", "isft", preset="paper", profile="paper", family="debate")
    assert (math_code.sft_lambda_loss, math_paper.sft_lambda_loss) == (0.8, 0.9)
    assert math_code.keep == (0.1, 0.8) and math_code.restart_from_base and math_code.init_temperature == 0.7
    assert (math_code.sft_lr, math_code.sft_epochs, math_code.instances) == (1e-6, 3, 7500)


def test_idpo_and_isft_dpo_presets() -> None:
    gsm = resolve_config("debate/gsm8k-v0", "idpo", profile="paper", family="debate")
    assert (gsm.dpo_beta, gsm.theta_filter, gsm.rpo_alpha, gsm.normalizer_percentile) == (
        0.25,
        0.5,
        1.0,
        85.0,
    )
    assert (gsm.dpo_lambda_token, gsm.dpo_lambda_loss, gsm.iterations, gsm.mcts_instances) == (
        0.6,
        0.7,
        5,
        7000,
    )
    assert (gsm.sft_lambda_token, gsm.sft_lambda_loss) == (0.4, 0.9)  # the iSFT initialization
    arc = resolve_config("debate/arc_challenge-v0", "idpo", profile="paper", family="debate")
    assert arc.iterations == 2 and arc.num_samples == 15 and arc.init_temperature == 0.3
    hotpot = resolve_config("ie/hotpotqa-v0", "isft-dpo", profile="paper")
    hotpot_paper = resolve_config("ie/hotpotqa-v0", "isft-dpo", preset="paper", profile="paper")
    assert (hotpot.dpo_beta, hotpot_paper.dpo_beta) == (0.1, 0.5)
    assert hotpot.rpo_alpha is None and hotpot.normalizer_percentile == 80.0
    assert (hotpot.sft_epochs, hotpot.instances, hotpot.mcts_instances, hotpot.iterations) == (
        2,
        10000,
        12000,
        3,
    )
    mmlu = resolve_config("debate/mmlu-v0", "isft-dpo", profile="paper", family="debate")
    assert (mmlu.theta_sft, mmlu.theta_filter) == (0.7, 0.45)


def test_cpu_profile_sizes_and_overrides() -> None:
    config = resolve_config("ie/synth-v0", "isft", profile="cpu", iterations=3, max_steps=None)
    assert config.lora and config.instances == 6 and config.num_samples == 3 and config.iterations == 3
    assert config.stop_at_speaker_tags and config.theta_sft == -0.5
    paper = resolve_config("ie/hotpotqa-v0", "isft", profile="paper")
    assert not paper.lora and not paper.stop_at_speaker_tags and paper.max_turns == 10
    with pytest.raises(TaskContractError, match="unknown config fields"):
        resolve_config("ie/synth-v0", "isft", bogus=1)


def test_unknown_task_falls_back_to_its_family_preset(caplog: pytest.LogCaptureFixture) -> None:
    config = resolve_config("acme/riddles-v0", "isft", profile="paper", family="debate")
    assert config.restart_from_base and config.sft_lambda_token == 0.4
    assert "no preset" in caplog.text


def test_config_round_trips_through_json() -> None:
    import json

    config = resolve_config("ie/synth-v0", "idpo", task_kwargs={"hops": 3})
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_stage_plans() -> None:
    def names(trainer, k):
        return [s.name for s in plan_stages(resolve_config("ie/synth-v0", trainer, iterations=k))]

    assert names("isft", 3) == ["iter_00", "iter_01", "iter_02"]
    assert names("idpo", 2) == ["iter_00", "iter_01", "iter_02"]
    assert names("isft-dpo", 2) == ["iter_00_sft", "iter_00_dpo", "iter_01_sft", "iter_01_dpo"]
    kinds = [s.kind for s in plan_stages(resolve_config("ie/synth-v0", "idpo", iterations=2))]
    assert kinds == ["sft", "dpo", "dpo"]
