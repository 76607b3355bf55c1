"""The command line of ``python -m benchmarks.run``: :class:`RunArgs` (one flag per field, documented
by the field's docstring), what ``--set`` reaches (:class:`BenchConfig`), and the command that
reproduces a run (:func:`command_line`)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from benchmarks.evaluation.policies import parse_agent_models
from optima_env import configtree
from optima_env.cli_support import (
    Parser,
    add_common_flags,
    add_field_flags,
    dataclass_from_args,
    task_args,
)
from optima_env.errors import RunConfigError
from optima_env.paths import check_input_folder, check_model_flag, check_output_folder
from optima_env.reward import RewardConfig

__all__ = [
    "BenchConfig",
    "RunArgs",
    "RunConfigError",
    "bench_config",
    "build_parser",
    "check_paths",
    "checkpoint_specs",
    "command_line",
    "hf_options",
    "parse_args",
    "parse_command",
    "task_args",
    "vllm_options",
]


@dataclass(frozen=True, kw_only=True)
class RunArgs:
    """Options of one benchmark run (each becomes a ``--flag``)."""

    suite: str = "main"
    """Suite: main, smoke, paper, scaling, baselines, rollout, loop or demo (its defaults fill every
    unset flag)."""
    task: tuple[str, ...] = ()
    """Task id or unique name (repeatable or comma-separated; default: the suite's tasks)."""
    methods: tuple[str, ...] = ()
    """Methods: cot, sc, mad, autoform (repeatable or comma-separated; default: the suite's)."""
    controls: bool = False
    """Also play the controls of information-exchange tasks (the final-hop holder alone, and each
    --checkpoint with its first agent's evidence from another instance) and print them beside the
    task's computed shortcut ceiling (on in the main suite)."""
    checkpoint: tuple[str, ...] = ()
    """A trained model as NAME=PATH (repeatable): one row each, the multi-agent system, greedy."""
    model: str = "embedded"
    """Model of the baselines: embedded, a Hugging Face name or folder, scripted (no model), or
    with --backend openai the name the server serves; or one model per agent,
    AGENT=MODEL[,AGENT=MODEL...] (e.g. Alice=embedded,Bob=runs/isft/iter_02/checkpoint)."""
    backend: str | None = None
    """Generation backend: hf, vllm, or openai (an OpenAI-compatible server, with --base-url)
    (default: the suite's)."""
    base_url: tuple[str, ...] = ()
    """--backend openai: the server's base URL, e.g. http://127.0.0.1:8000/v1 (repeatable: requests
    rotate over the servers)."""
    api_key_env: str = "OPENAI_API_KEY"
    """--backend openai: the environment variable holding the API key (unset: no key is sent)."""
    tokenizer: str | None = None
    """--backend openai: the tokenizer (Hugging Face name or folder) that counts each turn's tokens
    (default: the regex approximation)."""
    vllm_tensor_parallel_size: int = 1
    """--backend vllm: GPUs the engine shards the model over (vLLM's tensor_parallel_size)."""
    vllm_data_parallel_size: int = 1
    """--backend vllm: engine replicas; vLLM's offline engine takes 1 (for more, serve the model with
    `vllm serve MODEL --data-parallel-size N` and use --backend openai --base-url URL)."""
    vllm_gpu_memory_utilization: float = 0.9
    """--backend vllm: share of each GPU's memory vLLM may take (on CPUs: of host memory)."""
    precision: str = "auto"
    """--backend hf: decode precision of an fp32 model on CPU: auto (bf16 linear layers where the CPU
    has native bf16, fp32 elsewhere), float32 or bfloat16 (optima_env.backends.precision)."""
    episodes: int | None = None
    """Instances per task (the first N of the split; default: the suite's)."""
    split: str = "test"
    """Data split to evaluate on."""
    seed: int = 0
    """Seed of the episodes (evidence dealing, sampling)."""
    max_turns: int | None = None
    """Turns per conversation before truncation (paper: 10; default: the suite's)."""
    max_new_tokens: int | None = None
    """Token cap of one generated turn (default: the suite's)."""
    temperature: float = 0.0
    """Temperature of the one-sample methods (0 = greedy, as the paper evaluates)."""
    sc_n: int | None = None
    """Samples per instance of self-consistency (default: the suite's, 8)."""
    sc_temperature: float = 0.7
    """Sampling temperature of self-consistency."""
    scaling_k: int | None = None
    """Samples per instance in the scaling suite (paper: 50; default: the suite's)."""
    scaling_temperature: float = 0.5
    """Sampling temperature of the scaling suite (spec §8.3)."""
    concurrency: int | None = None
    """Episodes in flight, batched together at every turn (default: the suite's, 16; main and demo
    32, so the main command's 30 instances are one batch)."""
    data_dir: str | None = None
    """Benchmark data folder (default: $OPTIMA_DATA_DIR)."""
    out: str | None = None
    """Output folder (default: results/<suite>__<model>__<seed>__<time>); reuse it to resume."""
    viewer_limit: int = 20
    """Instances per (task, method) shown in viewer.html."""
    threads: int | None = None
    """CPU threads of torch (default: torch's choice; 1 is faster on a CPU shared with other jobs)."""
    update_readme: bool = False
    """demo, rollout and loop suites: rewrite the README block of the suite from this run."""
    progress: bool = True
    """Progress bars (rollouts, model loading); --no-progress silences every bar (tqdm's, the
    Hugging Face hub's and transformers')."""
    allow_missing: bool = False
    """Exit 0 when a task of the run was not evaluated (data missing, an extra not installed, not
    registered); without it such a run writes its outputs, then exits with status 2."""
    task_arg: tuple[str, ...] = ()
    """A task factory argument as NAME=VALUE for every task of the run (repeatable), e.g.
    style=small; VALUE is read as JSON when it parses (3, true, "x"), else as text."""
    set: tuple[str, ...] = ()
    """Set a configuration field by its dotted name, typed (repeatable): reward.lambda_token=0.4,
    reward.short_trajectory_tokens=none, ... (the reward of every episode; a task's own thresholds
    apply first). The fields are listed below."""

    def __post_init__(self) -> None:
        for name in ("episodes", "max_turns", "max_new_tokens", "sc_n", "scaling_k", "concurrency", "threads",
                     "vllm_tensor_parallel_size", "vllm_data_parallel_size"):  # fmt: skip
            _at_least(name, getattr(self, name), 1)
        _at_least("viewer_limit", self.viewer_limit, 0)
        for name in ("temperature", "sc_temperature", "scaling_temperature"):
            _at_least(name, getattr(self, name), 0.0)
        from optima_env.backends.precision import PRECISIONS

        if self.precision not in PRECISIONS:
            choices = ", ".join(PRECISIONS)
            raise RunConfigError(f"--precision must be one of {choices}, got {self.precision!r}")
        if not 0.0 < self.vllm_gpu_memory_utilization <= 1.0:
            raise RunConfigError(
                f"--vllm-gpu-memory-utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization}"
            )


def _at_least(name: str, value: float | None, low: float) -> None:
    """Refuse a numeric flag below ``low`` (``None``: the suite's default)."""
    if value is not None and value < low:
        flag = "--" + name.replace("_", "-")
        what = "instances per task" if name == "episodes" else "the value"
        raise RunConfigError(
            f"{flag} must be at least {low:g} ({what}), got {value:g}; pass {flag} {low:g} or more, "
            "or leave it out for the suite's default"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """What ``--set NAME=VALUE`` reaches in a benchmark run (the trainer's names for the same things)."""

    reward: RewardConfig = field(default_factory=RewardConfig)
    """The reward of every episode (its breakdown is in episodes.jsonl, the report and the viewer)."""


def vllm_options(args: RunArgs, backend: str) -> dict[str, Any]:
    """vLLM's scale switches from the ``--vllm-*`` flags (``--backend vllm`` only; passed to
    :meth:`optima_env.backends.vllm.VLLMPolicy.from_pretrained`)."""
    if backend != "vllm":
        return {}
    return {
        "tensor_parallel_size": args.vllm_tensor_parallel_size,
        "data_parallel_size": args.vllm_data_parallel_size,
        "gpu_memory_utilization": args.vllm_gpu_memory_utilization,
    }


def hf_options(args: RunArgs, backend: str) -> dict[str, Any]:
    """The transformers engine's options from the flags (``--precision``; ``--backend hf`` only)."""
    return {"precision": args.precision} if backend == "hf" else {}


def bench_config(args: RunArgs) -> BenchConfig:
    """The ``--set`` values applied to :class:`BenchConfig` (a bad name or value fails here)."""
    return configtree.apply(BenchConfig(), configtree.parse_sets(args.set))


def checkpoint_specs(specs: tuple[str, ...]) -> dict[str, str]:
    """``--checkpoint NAME=PATH`` values as ``{name: path}`` (a malformed or repeated one is refused)."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise RunConfigError(f"--checkpoint expects NAME=PATH (e.g. iSFT=runs/isft/iter5), got {spec!r}")
        if name.strip() in out:
            raise RunConfigError(f"--checkpoint name {name.strip()!r} is given twice; names label the rows")
        out[name.strip()] = path.strip()
    return out


_MODEL_NAMES = ("embedded", "scripted")


def check_paths(args: RunArgs, backend: str, checkpoints: dict[str, str]) -> None:
    """Refuse path-taking flags that cannot work, before any model is loaded or folder made."""
    if args.out is not None:
        check_output_folder("--out", args.out)
    if args.data_dir:
        check_input_folder("--data-dir", args.data_dir)
    if args.model != "scripted" and backend != "openai":
        models = parse_agent_models(args.model) or {"": args.model}
        for agent, model in models.items():
            check_model_flag(f"--model (agent {agent})" if agent else "--model", model, names=_MODEL_NAMES)
    if args.tokenizer is not None:
        check_model_flag("--tokenizer", args.tokenizer)
    for name, path in checkpoints.items():
        check_model_flag(f"--checkpoint {name}=PATH:", path, names=_MODEL_NAMES)


# -- command line ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """One flag per :class:`RunArgs` field (:func:`optima_env.cli_support.add_field_flags`), plus
    the common ``--debug``, ``--log-level`` and ``--quiet``."""
    parser = Parser(
        "python -m benchmarks.run",
        __doc__,
        epilog="configuration fields (--set NAME=VALUE; type, default: doc):\n"
        + "\n".join(f"  {line}" for line in configtree.describe(BenchConfig)),
    )
    add_field_flags(parser, RunArgs)
    add_common_flags(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> RunArgs:
    """Parse the command line into :class:`RunArgs`: one flag per field, documented by the field's
    docstring, each value parsed into the field's type (repeatable flags also split at commas,
    except ``--set``); a bad value raises :class:`~optima_env.configtree.ConfigError`."""
    return parse_command(argv)[0]


def parse_command(argv: list[str] | None = None) -> tuple[RunArgs, argparse.Namespace]:
    """:class:`RunArgs` and the whole namespace (with the common flags: ``--log-level``, ...)."""
    ns = build_parser().parse_args(argv)
    return dataclass_from_args(RunArgs, ns, keep_commas=("set",)), ns


def command_line(args: RunArgs) -> list[str]:
    """The command that reproduces (and resumes) this run: every flag that differs from its default."""
    words = ["python", "-m", "benchmarks.run"]
    for f in dataclasses.fields(RunArgs):
        value = getattr(args, f.name)
        if value == f.default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag[2:])
            continue
        for item in value if isinstance(value, tuple) else (value,):
            words += [flag, str(item)]
    return words
