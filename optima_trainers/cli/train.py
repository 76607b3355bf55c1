"""Command line of the trainers: ``python -m optima_trainers.train``.

Examples::

    python -m optima_trainers.train --task ie/synth-v0 --trainer isft --iterations 2
    python -m optima_trainers.train --task hotpotqa --trainer idpo --profile paper --backend vllm
    python -m optima_trainers.train --trainer isft --set reward.lambda_token=0.4 --set sft.lora=false
    python -m optima_trainers.train --resume --run-dir runs/ie_synth-v0__isft__0__20250101-120000
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml -m optima_trainers.train ...

``--trainer`` takes any trainer registered through the ``optima`` entry points (``--help`` lists
the installed ones and their own options). Values come from the task's presets (``--preset
code|paper``) sized by ``--profile cpu|paper`` (``auto``: ``paper`` with a GPU, else ``cpu``);
every flag below overrides them (each an alias of a configuration field, made by
:mod:`optima_env.cli_support` from :data:`FLAGS`: its help is the field's docstring, with the
dotted name in brackets), and ``--set NAME=VALUE`` reaches any field of the configuration
tree by its dotted name, parsed into the field's type (a bad name or value is refused before
anything runs). ``--resume`` continues a run from its folder with its stored configuration (only
``--iterations`` may change). Exit statuses are every command's (:mod:`optima_env.cli_support`):
expected errors print one line and exit with status 2 (``--debug`` prints the traceback first;
``--log-level`` / ``--quiet`` set the log lines), a bug exits with 1: a path flag that cannot
work (``--model``, ``--readability-model``,
``--run-dir``, ``--data-dir``) is refused before anything loads, and a run that fails before its
first stage leaves no folder behind. A stage whose iSFT selection keeps nothing stops the run,
saying how far the best trajectory fell short of θ_sft. Ctrl-C prints the command that resumes
(exit status 130). Default run folders never collide (``-2``, ``-3``, ... within one second); one
process writes a run folder at a time (a second is refused, naming the first's pid).
``--no-progress`` silences every progress bar (ours, TRL's and transformers').
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from optima_env.cli_support import (
    Flag,
    Parser,
    add_common_flags,
    add_field_flags,
    field_values,
    progress_silenced,
    run_command,
    setup_logging,
)
from optima_env.configtree import ConfigError, describe, field_docs, parse_sets
from optima_env.errors import OptimaError
from optima_trainers.run.memory_plan import GB, plan_run

__all__ = ["build_parser", "main", "resolve_from_args"]

logger = logging.getLogger("optima_trainers")

FLAGS: tuple[Flag, ...] = (
    Flag.of("--task", "task"),
    Flag.of("--trainer", "trainer"),
    Flag.of("--preset", "preset"),
    Flag.of("--profile", "profile", also=("auto",)),
    Flag.of("--model", "model"),
    Flag.of("--iterations", "iterations"),
    Flag.of("--seed", "seed"),
    Flag.of("--backend", "generation.backend"),
    Flag.of("--instances", "generation.instances"),
    Flag.of("--samples", "generation.num_samples"),
    Flag.of("--max-turns", "generation.max_turns"),
    Flag.of("--max-new-tokens", "generation.max_new_tokens"),
    Flag.of("--concurrency", "generation.concurrency"),
    Flag.of("--lambda-token", "reward.lambda_token"),
    Flag.of("--lambda-loss", "reward.lambda_loss"),
    Flag.of("--reward-preset", "reward_preset"),
    Flag.of("--lr", "sft.learning_rate"),
    Flag.of("--epochs", "sft.epochs"),
    Flag.of("--batch-size", "sft.batch_size"),
    Flag.of("--max-steps", "sft.max_steps", "dpo.max_steps"),
    Flag.of("--full-finetune", "sft.lora", "dpo.lora", const=False, switch=True),
    Flag.of("--theta-sft", "selection.theta"),
    Flag.of("--min-task-score", "selection.min_task_score"),
    Flag.of("--selection-order", "selection.order"),
    Flag.of("--report-to", "report_to"),
    Flag.of("--normalizer-instances", "tree.normalizer_instances"),
    Flag.of("--mcts-instances", "tree.instances"),
    Flag.of("--readability-model", "readability_model"),
)
"""The convenience flags: aliases of configuration fields (type and help come from the field;
``--set NAME=VALUE`` reaches every other one). ``--task``, ``--trainer``, ``--preset`` and
``--profile`` choose the layers :func:`~optima_trainers.config.train.resolve_config` starts from."""
_LAYERS = ("task", "trainer", "preset", "profile")


def _trainer_help(pm: Any) -> str:
    from optima_env.registry import trainer_specs
    from optima_trainers.config.train import TrainConfig, option_names

    lines = ["installed trainers (--trainer NAME):"]
    try:
        specs = trainer_specs(pm)
    except OptimaError as exc:  # a broken plugin must not hide --help
        return f"installed trainers: cannot list them ({exc})"
    for name, spec in specs.items():
        lines.append(f"  {name:10s} {spec.description}")
        cls = spec.config_class
        if cls is not None:
            docs = field_docs(cls)
            for dotted in option_names(spec):
                leaf = dotted.split(".")[-1]
                lines.append(f"      --set {dotted}=...  {docs.get(leaf, '')}")
    lines += ["", "configuration fields (--set NAME=VALUE; type, default: doc):"]
    example = TrainConfig(task="TASK", trainer="TRAINER")
    lines += [f"  {line}" for line in describe(TrainConfig, example) if not line.startswith("options ")]
    return "\n".join(lines)


def build_parser(pm: Any = None) -> argparse.ArgumentParser:
    """The argument parser; with a plugin manager, ``--help`` lists the installed trainers."""
    from optima_trainers.config.train import TrainConfig

    parser = Parser(
        "python -m optima_trainers.train",
        __doc__,
        epilog=_trainer_help(pm) if pm is not None else None,
    )
    add_field_flags(parser, TrainConfig, FLAGS)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set any configuration field by its dotted name (typed; see the list below)",
    )
    parser.add_argument(
        "--run-dir", default=None, help="run folder (default: runs/<task>__<trainer>__<seed>__<time>)"
    )
    parser.add_argument("--runs-root", default="runs", help="parent of new run folders (default: runs)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --run-dir (or the latest)")
    parser.add_argument("--data-dir", default=None, help="benchmark data folder (sets OPTIMA_DATA_DIR)")
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads of torch (1 when sharing a CPU)"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config and exit; loads no model, so offline a hub --model that is not "
        "in the cache is printed with a warning that it was not checked",
    )
    parser.add_argument(
        "--plan-gpu-gb",
        type=float,
        default=None,
        metavar="GB",
        help="plan the run's GPU memory for GPUs of GB (10^9 bytes) each, with a GPU's defaults, e.g. "
        "with --print-config on a machine without one (with a GPU the run plans for it anyway)",
    )
    add_common_flags(parser)
    return parser


def _overrides(ns: argparse.Namespace) -> dict[str, Any]:
    """The configuration fields set by flags and ``--set`` (the layers' choices left out)."""
    from optima_trainers.config.train import TrainConfig

    out = {k: v for k, v in field_values(ns, TrainConfig, FLAGS).items() if k not in _LAYERS}
    out.update(parse_sets(ns.set))
    return out


def _profile(name: str | None) -> str:
    if name is None:
        return _profile("auto")
    if name != "auto":
        return name
    from optima_trainers.config.train import cuda_available

    return "paper" if cuda_available() else "cpu"


def resolve_from_args(ns: argparse.Namespace, pm: Any) -> tuple[Any, Any]:
    """``(config, run_dir)`` from parsed arguments: a new run, or the stored one with ``--resume``."""
    from optima_env.registry import resolve_task_id, task_specs, trainer_specs
    from optima_trainers.config.train import TrainConfig, resolve_config
    from optima_trainers.run.folder import RunDir

    overrides = _overrides(ns)
    layers = field_values(ns, TrainConfig, [f for f in FLAGS if f.dest in _LAYERS])
    task = resolve_task_id(ns.task or "ie/synth-v0", pm)
    trainer = ns.trainer or "isft"
    specs = trainer_specs(pm)
    if trainer not in specs:
        raise ConfigError(f"no trainer {trainer!r}; installed: {', '.join(specs)} (see --help)")
    if ns.resume:
        root = ns.run_dir or RunDir.latest(ns.runs_root, f"{task.replace('/', '_')}__{trainer}__")
        if root is None:
            raise ConfigError(
                f"--resume found no run of {task} / {trainer} under {ns.runs_root}; give --run-dir"
            )
        run, stored = RunDir.open(root)
        if (ns.task is not None and stored.task != task) or (
            ns.trainer is not None and stored.trainer != trainer
        ):
            raise ConfigError(
                f"--resume: {root} holds a run of {stored.task} / {stored.trainer}, not {task} / {trainer}"
            )
        iterations = overrides.pop("iterations", None)
        updated = stored.replace(**overrides) if overrides else stored
        conflicts = stored.resume_conflicts(updated)
        if conflicts:
            raise ConfigError(
                f"--resume keeps the run's stored config; these settings differ from it: {conflicts} "
                "(stored, given); drop them (only --iterations may change on resume)"
            )
        if iterations is not None:
            stored = stored.replace(iterations=iterations)
        return stored, run
    spec = task_specs(pm)[task]
    profile = _profile(layers.get("profile"))
    if profile == "paper" and overrides.get("sft.lora") is False and overrides.get("dpo.lora") is False:
        profile = "paper-full"  # --full-finetune at the spec's sizes: the recipes' full-FT learning rates
    config = resolve_config(
        spec,
        specs[trainer],
        preset=layers.get("preset", "code"),
        profile=profile,
        overrides=overrides,
        device="cuda" if ns.plan_gpu_gb else None,  # planned for a GPU: its defaults (bf16, checkpointing)
    )
    config, memory = plan_run(config, ns.plan_gpu_gb * GB if ns.plan_gpu_gb else None)
    if memory is not None:
        logger.info("\n".join(memory.lines()))
        if not ns.print_config:
            memory.check()
    if ns.print_config:
        return config, None
    _check_config_paths(config)
    return config, _create_run(config, ns)


def _create_run(config: Any, ns: argparse.Namespace) -> Any:
    """A new run folder; under ``accelerate launch`` with several processes the main process
    creates it and the others open it (its path is broadcast, so every process agrees on the
    default name even when their clocks read different seconds)."""
    from optima_trainers.run.folder import RunDir
    from optima_trainers.run.trl import world_size

    if world_size() == 1:
        return RunDir.create(config, run_dir=ns.run_dir, base=ns.runs_root)
    import torch
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    state = PartialState(cpu=not torch.cuda.is_available())  # as the trainers' own TrainingArguments
    root = (
        [str(RunDir.create(config, run_dir=ns.run_dir, base=ns.runs_root).root)]
        if state.is_main_process
        else [None]
    )
    broadcast_object_list(root)
    run, _ = RunDir.open(root[0])
    return run


def _set_threads(threads: int | None) -> None:
    if threads is None:
        return
    if threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    try:
        import torch
    except ImportError:  # no torch: only the env variables matter (e.g. a remote backend)
        return
    torch.set_num_threads(threads)


def _check_paths(ns: argparse.Namespace) -> None:
    """Refuse path-taking flags that cannot work, before anything is loaded or created.

    ``--print-config`` loads no model, so offline it prints the configuration of a hub model that
    is not in the local cache (as a configuration for another machine), with one warning that the
    model was not checked."""
    from optima_env.paths import check_input_folder, check_model_flag, check_output_folder

    for flag in ("--model", "--readability-model"):
        value = getattr(ns, flag.lstrip("-").replace("-", "_"))
        if value is not None and not check_model_flag(flag, value, require_cached=not ns.print_config):
            logger.warning(
                "%s %r was not checked: the hub is offline (HF_HUB_OFFLINE=1) and it is not in the "
                "Hugging Face cache; --print-config loads no model, but a run here would refuse it",
                flag,
                value,
            )
    if ns.data_dir:
        check_input_folder("--data-dir", ns.data_dir)
    if not ns.resume:
        check_output_folder("--runs-root", ns.runs_root)
        if ns.run_dir is not None:
            check_output_folder("--run-dir", ns.run_dir)


def _check_config_paths(config: Any) -> None:
    """The resolved configuration's models (set by a flag, ``--set`` or a preset) can load."""
    from optima_env.paths import check_model_flag

    check_model_flag("model", config.model)
    if config.readability_model:
        check_model_flag("readability_model", config.readability_model)
    for agent, model in dict(config.generation.agent_models).items():
        check_model_flag(f"generation.agent_models[{agent!r}]", model)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (:mod:`optima_env.cli_support`: 0 ok, 2 on a usage,
    configuration or data error, 130 when interrupted, with the command that resumes, 1 on a bug)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    state: dict[str, Any] = {"run": None, "created": False, "discarded": False}

    def body() -> int:
        from optima_env.registry import get_plugin_manager
        from optima_trainers.host.loop import describe_plan, plan_stages

        pm = get_plugin_manager()
        wants_help = any(a in ("-h", "--help") for a in argv)
        ns = build_parser(pm if wants_help else None).parse_args(argv)
        setup_logging(ns)
        _check_paths(ns)
        if ns.data_dir:
            os.environ["OPTIMA_DATA_DIR"] = ns.data_dir
        _set_threads(ns.threads)
        config, state["run"] = resolve_from_args(ns, pm)
        logger.info(describe_plan(config, plan_stages(config, pm)))
        if config.profile != "cpu" and config.model == "embedded":
            logger.warning(
                "--profile %s sizes the run for GPUs, but the model is the embedded 135M one; name the "
                "model to train with --model (e.g. --model meta-llama/Meta-Llama-3-8B-Instruct)",
                config.profile,
            )
        if ns.print_config:
            print(json.dumps(config.to_dict(), indent=2))
            return 0
        state["created"] = not ns.resume
        logger.info("run folder: %s", state["run"].root)
        _report(_train(config, state["run"], pm, progress=not ns.no_progress), state["run"])
        return 0

    def cleanup() -> None:
        state["discarded"] = _discard(state["run"], state["created"])

    def interrupted(_: KeyboardInterrupt) -> str:
        if state["discarded"] or state["run"] is None:
            return "interrupted before the run started; nothing to resume"
        resume = f"python -m optima_trainers.train --resume --run-dir {state['run'].root}"
        return f"interrupted; continue with: {resume}"

    with progress_silenced("--no-progress" in argv):  # every bar, ours and the libraries'
        return run_command(body, argv=argv, on_interrupt=interrupted, cleanup=cleanup)


def _report(metrics: list[dict[str, Any]], run: Any) -> None:
    """One line per stage with its main metrics, then the run folder."""
    keys = (
        "reward/total",
        "rollout/task_score",
        "rollout/tokens",
        "select/selected",
        "mcts/pairs",
        "train/loss",
    )
    for record in metrics:
        shown = ", ".join(f"{k}={record[k]:.4g}" for k in keys if k in record)
        print(f"{record['stage']}: {shown}")
    print(f"run folder: {run.root}")


def _train(config: Any, run: Any, pm: Any, *, progress: bool) -> list[dict[str, Any]]:
    from optima_trainers.host.loop import IterativeTrainer

    return IterativeTrainer(config, run_dir=run, pm=pm, progress=progress).run()


def _discard(run: Any, created: bool) -> bool:
    """Remove a run this invocation created that failed before its first stage (it would block
    the corrected command and could only resume the failing configuration)."""
    if run is None or not created:
        return False
    discarded = run.discard_unstarted()
    if discarded:
        logger.info("removed %s: the run failed before its first stage", run.root)
    return discarded
