"""The shipped ``configs/accelerate/*.yaml`` go through accelerate's own loading and launch
preparation (what ``accelerate launch --config_file ...`` does before it starts any process):
known keys only, the intended distributed type, the DeepSpeed stage reaching the processes'
environment, and the multi-node flags turned into torchrun's node layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

CONFIGS = REPO_ROOT / "configs" / "accelerate"
EXPECTED = {  # file -> (distributed type, DeepSpeed ZeRO stage or None)
    "multi_gpu.yaml": ("MULTI_GPU", None),
    "deepspeed_zero2.yaml": ("DEEPSPEED", 2),
    "deepspeed_zero3.yaml": ("DEEPSPEED", 3),
}

accelerate = pytest.importorskip("accelerate")


def _prepare(config: Path, *flags: str) -> tuple[object, dict[str, str]]:
    """Parse and validate like ``accelerate launch``; returns its arguments and the processes' env."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch_command_parser().parse_args(
        ["--config_file", str(config), *flags, "-m", "optima_trainers.train", "--task", "ie/synth-v0"]
    )
    args, defaults, from_config = _validate_launch_command(args)
    if args.use_deepspeed:
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    return args, env


def test_every_shipped_config_is_covered() -> None:
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_config_loads_with_accelerates_own_loader(name: str) -> None:
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    distributed, stage = EXPECTED[name]
    config = load_config_from_file(str(CONFIGS / name))  # unknown keys raise ValueError
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type.name == distributed
    assert (config.num_machines, config.num_processes, config.mixed_precision) == (1, 8, "no")
    assert (config.deepspeed_config or {}).get("zero_stage") == stage

    args, env = _prepare(CONFIGS / name)
    assert args.num_processes == 8 and env.get("ACCELERATE_MIXED_PRECISION") == "no"
    if stage is None:
        assert args.multi_gpu and not args.use_deepspeed
    else:
        assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
        assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == str(stage)
        assert env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == str(stage == 3).lower()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_documented_multi_node_flags_give_torchruns_node_layout(name: str) -> None:
    flags = ["--num_machines", "2", "--num_processes", "16", "--machine_rank", "1"]
    flags += ["--main_process_ip", "10.0.0.1", "--main_process_port", "29500"]
    args, _ = _prepare(CONFIGS / name, *flags)
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("2", "8", 1)
    endpoint = getattr(args, "rdzv_endpoint", None) or f"{args.master_addr}:{args.master_port}"
    assert endpoint == "10.0.0.1:29500"
