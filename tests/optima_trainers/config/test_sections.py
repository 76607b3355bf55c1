"""``generation.vllm_weights``: which design of the run's one vLLM engine a configuration gets
(base + adapters, or weights in place), and the rank its adapters reach."""

from __future__ import annotations

import pytest

from optima_env.errors import ConfigError
from optima_trainers import resolve_config
from optima_trainers.config.sections import GenerationConfig, lora_stage_rank, resolve_vllm_weights


def config(trainer: str = "isft-dpo", profile: str = "paper", **sets):
    return resolve_config("ie/synth-v0", trainer, profile=profile, device="cuda",
                          overrides={"generation.backend": "vllm", **sets})  # fmt: skip


def test_auto_is_adapters_on_a_gpu_with_lora_training_and_one_engine() -> None:
    assert resolve_vllm_weights(config(), cuda=True) == "adapters"
    assert resolve_vllm_weights(config(), cuda=False) == "in_place"  # vLLM-CPU: LoRA rows are slow
    assert resolve_vllm_weights(config("isft", "paper-full"), cuda=True) == "in_place"  # no adapter
    assert resolve_vllm_weights(config(**{"generation.vllm_reuse_engine": False}), cuda=True) == "in_place"
    assert resolve_vllm_weights(config(**{"generation.vllm_weights": "in_place"}), cuda=True) == "in_place"
    assert resolve_vllm_weights(config(**{"generation.backend": "hf"}), cuda=True) == "in_place"


def test_adapters_is_taken_as_set_even_on_cpus() -> None:
    assert resolve_vllm_weights(config(**{"generation.vllm_weights": "adapters"}), cuda=False) == "adapters"


def test_adapters_without_an_adapter_or_without_one_engine_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"full fine-tuning.*vllm_weights=in_place"):
        resolve_vllm_weights(
            config("isft", "paper-full", **{"generation.vllm_weights": "adapters"}), cuda=True
        )
    fresh = config(**{"generation.vllm_weights": "adapters", "generation.vllm_reuse_engine": False})
    with pytest.raises(ConfigError, match="one engine for the run"):
        resolve_vllm_weights(fresh, cuda=True)


def test_an_unknown_value_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"vllm_weights must be one of auto, in_place, adapters"):
        GenerationConfig(vllm_weights="merged")  # type: ignore[arg-type]


def test_the_adapters_rank_is_every_training_stages_lora_r() -> None:
    two = config(**{"iterations": 2})
    assert lora_stage_rank(two) == 2 * (two.sft.lora_r + two.dpo.lora_r)  # sft, dpo, sft, dpo
    isft = config("isft", **{"iterations": 3})
    assert lora_stage_rank(isft) == 3 * isft.sft.lora_r
    assert lora_stage_rank(config("isft", "paper-full")) is None


@pytest.mark.parametrize("trainer", ["isft", "idpo", "isft-dpo"])
@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_the_adapters_rank_counts_the_stages_each_trainer_plans(trainer, iterations) -> None:
    """``lora_stage_rank`` knows each built-in trainer's stages from its name: the sum of the
    ``lora_r`` of the stages its backend plans, so a change to a trainer's stage list fails here."""
    from optima_trainers.backends import contract

    cfg = config(trainer, **{"iterations": iterations})
    backends = {"isft": contract.ISFTBackend, "idpo": contract.IDPOBackend}
    stages = backends.get(trainer, contract.ISFTDPOBackend)(cfg).stages(cfg)
    assert lora_stage_rank(cfg) == sum(getattr(cfg, s.kind).lora_r for s in stages)
