"""The configuration's GPU defaults: bf16, LoRA and gradient checkpointing when a GPU is present;
DPO trains in the dtype it is given."""

from __future__ import annotations

import math

import pytest

from optima_trainers.config.train import resolve_config


@pytest.mark.parametrize("trainer", ["isft", "idpo", "isft-dpo"])
def test_with_cuda_reported_the_run_gets_bf16_lora_and_gradient_checkpointing(trainer: str) -> None:
    config = resolve_config("ie/hotpotqa-v0", trainer, profile="paper", device="cuda")
    assert config.dtype == "bfloat16"
    assert config.sft.lora and config.dpo.lora
    assert config.sft.gradient_checkpointing and config.dpo.gradient_checkpointing
    assert config.sft.learning_rate == 1e-4 and config.dpo.learning_rate == 5e-6  # LoRA-sized


def test_on_cpus_the_run_stays_fp32_without_checkpointing_and_the_user_wins() -> None:
    config = resolve_config("ie/synth-v0", "idpo", profile="cpu", device="cpu")
    assert config.dtype == "float32" and config.sft.lora and config.dpo.lora
    assert config.sft.gradient_checkpointing is False and config.dpo.gradient_checkpointing is False
    mine = resolve_config("ie/synth-v0", "idpo", device="cuda",
                          overrides={"dtype": "float32", "sft.gradient_checkpointing": "false"})  # fmt: skip
    assert mine.dtype == "float32" and mine.sft.gradient_checkpointing is False
    assert mine.dpo.gradient_checkpointing is True  # only what the user left unset follows the device


def test_full_fine_tuning_is_the_opt_in_paper_full_profile_with_the_recipes_rates() -> None:
    full = resolve_config("ie/hotpotqa-v0", "isft-dpo", profile="paper-full", device="cuda")
    assert not full.sft.lora and not full.dpo.lora
    assert full.sft.learning_rate == 2e-5 and full.dpo.learning_rate == 5e-7  # spec §7 Table 8
    lora = resolve_config("ie/hotpotqa-v0", "isft-dpo", profile="paper", device="cuda")
    # the same sizes: only LoRA and its learning rates differ
    differing = {k for k, v in full.to_dict()["sft"].items() if lora.to_dict()["sft"][k] != v}
    assert differing == {"lora", "learning_rate"} and full.generation == lora.generation


@pytest.mark.slow
def test_dpo_trains_in_bf16_on_cpu_and_saves_in_the_training_dtype(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    from safetensors import safe_open

    from optima_trainers.config.training import DPOTrainConfig
    from optima_trainers.dpo.trainer import train_dpo
    from tests.optima_trainers.dpo.test_dpo import make_pairs
    from tests.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    config = DPOTrainConfig.cpu(learning_rate=1e-3, rpo_alpha=1.0, max_length=256, evaluate=False)
    out = tmp_path / "bf16"
    result = train_dpo(model_path=str(model), pairs=make_pairs(5), config=config, output_dir=out, dtype="bfloat16")
    assert result.steps == 2 and math.isfinite(result.train_loss)
    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:
        dtypes = {f.get_tensor(k).dtype for k in f.keys()}
    assert dtypes == {torch.bfloat16}


def test_full_finetune_at_the_papers_sizes_takes_the_recipes_learning_rates(capsys) -> None:
    import json

    from optima_trainers.cli.train import main

    argv = ["--task", "hotpotqa", "--trainer", "isft", "--profile", "paper", "--print-config"]
    assert main([*argv, "--full-finetune"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert (full["profile"], full["sft"]["lora"], full["sft"]["learning_rate"]) == ("paper-full", False, 2e-5)
    assert main(argv) == 0
    lora = json.loads(capsys.readouterr().out)
    assert (lora["profile"], lora["sft"]["lora"], lora["sft"]["learning_rate"]) == ("paper", True, 1e-4)
