"""vLLM's scale switches (tensor_parallel_size, data_parallel_size, gpu_memory_utilization) from the
trainer CLI (``generation.vllm_*``) and from ``benchmarks.run`` (``--vllm-*``) to the keyword
arguments of :meth:`optima_env.backends.vllm.VLLMPolicy.from_pretrained`, which checks them before
starting anything. A real engine start through the same mapping:
``tests/optima_env/backends/test_vllm.py``."""

from __future__ import annotations

import pytest

from benchmarks.run import parse_args, vllm_options
from optima_env.configtree import ConfigError
from optima_env.errors import TaskContractError
from optima_env.registry import get_plugin_manager
from optima_trainers.cli.train import build_parser, resolve_from_args

SWITCHES = {"tensor_parallel_size": 4, "data_parallel_size": 1, "gpu_memory_utilization": 0.5}


def trainer_config(*argv: str):
    pm = get_plugin_manager()
    config, run = resolve_from_args(build_parser(pm).parse_args([*argv, "--print-config"]), pm)
    assert run is None
    return config


def test_the_trainer_cli_sets_the_vllm_switches() -> None:
    config = trainer_config(
        "--backend", "vllm", "--set", "generation.vllm_tensor_parallel_size=4",
        "--set", "generation.vllm_gpu_memory_utilization=0.5",
    )  # fmt: skip
    assert config.generation.policy_options() == SWITCHES
    hf = trainer_config("--backend", "hf").generation.policy_options()
    assert hf == {"precision": "auto", "sampler": "cdf"}  # the transformers engine's own options
    assert trainer_config("--backend", "vllm").generation.policy_options() == {
        "tensor_parallel_size": 1,
        "data_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
    }


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("vllm_tensor_parallel_size", "0"),
        ("vllm_data_parallel_size", "-1"),
        ("vllm_gpu_memory_utilization", "1.5"),
    ],
)
def test_bad_switches_are_refused_before_anything_runs(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"generation.{name}"):
        trainer_config("--backend", "vllm", "--set", f"generation.{name}={value}")


def test_benchmarks_run_flags_set_the_vllm_switches() -> None:
    args = parse_args(
        ["--backend", "vllm", "--vllm-tensor-parallel-size", "4", "--vllm-gpu-memory-utilization", "0.5"]
    )
    assert vllm_options(args, "vllm") == SWITCHES
    assert vllm_options(args, "hf") == {} and vllm_options(args, "openai") == {}


def test_vllm_policy_refuses_data_parallel_with_what_to_do_instead() -> None:
    from optima_env.backends.vllm import VLLMPolicy

    with pytest.raises(TaskContractError, match=r"vllm serve MODEL --data-parallel-size 2.*--backend openai"):
        VLLMPolicy.from_pretrained("embedded", data_parallel_size=2)
    with pytest.raises(TaskContractError, match="gpu_memory_utilization must lie in"):
        VLLMPolicy.from_pretrained("embedded", gpu_memory_utilization=1.5)
    with pytest.raises(TaskContractError, match="tensor_parallel_size must be an int >= 1"):
        VLLMPolicy.from_pretrained("embedded", tensor_parallel_size=0)


def test_the_transformers_engines_kv_budget_reaches_the_policy_from_the_trainer_cli() -> None:
    from optima_env.backends.loading import load_policy

    config = trainer_config("--backend", "hf", "--set", "generation.hf_kv_cache_mb=512")
    assert config.generation.policy_options() == {"precision": "auto", "sampler": "cdf", "kv_cache_mb": 512}
    policy = load_policy("embedded", backend="hf", batch_size=4, **config.generation.policy_options())
    assert policy.kv_cache_mb == 512
    assert load_policy("embedded", backend="hf", batch_size=4).kv_cache_mb == 4096  # the engine's default
    with pytest.raises(ConfigError, match=r"generation.hf_kv_cache_mb must be a finite number > 0"):
        trainer_config("--backend", "hf", "--set", "generation.hf_kv_cache_mb=0")
    with pytest.raises(TaskContractError, match="kv_cache_mb must be a number > 0"):
        load_policy("embedded", backend="hf", batch_size=4, kv_cache_mb=-1)
