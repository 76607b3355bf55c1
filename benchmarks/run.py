"""Evaluate baselines and trained checkpoints on optima tasks; write a paper-style report.

With no arguments (the ``main`` suite): the demo's synthetic task (``ie/synth-v0``, 2 hops, no
agent can answer alone) played by the embedded model (SmolLM2-135M-Instruct) untrained, as a
single agent (CoT) and as the 2-agent system (MAD), against the three trained systems whose
adapters the demo suite committed (iSFT, iDPO, iSFT-DPO), greedy, with the same caps, on 30
held-out instances; the table gives 95% bootstrap intervals and the ratios to MAD. Other suites:
``smoke`` (CoT and MAD on 4 instances), ``paper`` (spec §8.1, for a GPU), ``scaling`` (spec
§8.3), ``rollout`` and ``loop`` (engine and training-loop throughput), ``handoff`` (a stage's weights
reaching the vLLM engine: :mod:`benchmarks.throughput.handoff_bench`) and ``demo`` (the three
trainers trained on CPU, then evaluated: :mod:`benchmarks.demo.suite`); see :mod:`benchmarks.suites`,
and :mod:`benchmarks.evaluation.methods` for the methods (cot, sc, mad, autoform, and ``--checkpoint
NAME=PATH``).

Writes under ``--out`` (default ``results/<suite>__<model>__<seed>__<time>/``):

* ``episodes.jsonl``: every episode (turns, answer, tokens, reward breakdown; ``metadata`` holds
  method / instance / sample), appended and fsync'ed as each one ends;
* ``results.json``: the rows, scaling curves and the run's provenance;
* ``report.md``: the Table-1-style table, all rows, provenance; ``score_vs_tokens.png`` and
  (scaling) ``scaling.png``; ``viewer.html``: the conversations with their reward breakdowns.

Rerunning the same command with the same ``--out`` resumes: finished (method, task, instance,
sample) units are read back and not generated again; Ctrl-C prints that command. One process
writes an ``--out`` at a time (its ``.lock`` names the holder's pid; a second run is refused). A
task whose data is not there is reported as ``data missing: <reason>`` instead of stopping the
run; the command then exits with status 2 after writing its outputs, unless ``--allow-missing``
is given (the demo suite reports such a task and exits 0). A malformed data file stops the run,
naming the file, line and field.

Examples::

    python -m benchmarks.run
    python -m benchmarks.run --task ie/synth-v0 --methods cot,sc,mad,autoform --episodes 8
    python -m benchmarks.run --suite scaling --scaling-k 16 --out results/scaling
    python -m benchmarks.run --checkpoint iSFT=runs/isft/iter5 --checkpoint iDPO=runs/idpo/iter5
    python -m benchmarks.run --model scripted --episodes 3     # no model: plumbing check
    python -m benchmarks.run --backend openai --base-url http://127.0.0.1:8000/v1 --model NAME

An expected error (a bad flag or path, malformed data, a missing extra, a failing server) is one
line on stderr and exit code 2, raised before any model loads where it can be; ``--debug`` prints
its traceback too.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.args import (
    RunArgs,
    RunConfigError,
    bench_config,
    check_paths,
    checkpoint_specs,
    command_line,
    hf_options,
    parse_args,
    parse_command,
    task_args,
    vllm_options,
)
from benchmarks.evaluate import checkout_commit, evaluate, suite_concurrency
from benchmarks.evaluation.outputs import require_evaluated
from benchmarks.evaluation.policies import check_backend_flags
from benchmarks.suites import get_suite
from optima_env import configtree
from optima_env.cli_support import progress_silenced, run_command, setup_logging
from optima_env.io import write_text_atomic
from optima_env.paths import folder_lock

__all__ = [
    "PERFORMANCE_PAGE",
    "REPO_README",
    "RunArgs",
    "RunConfigError",
    "hf_options",
    "main",
    "parse_args",
    "run",
    "unlinked",
    "update_performance_page",
    "vllm_options",
]

logger = logging.getLogger("benchmarks.run")
REPO_README = Path(__file__).resolve().parents[1] / "README.md"
PERFORMANCE_PAGE = REPO_README.parent / "docs" / "benchmarks" / "performance.md"
"""The documentation page whose ``performance`` block ``--suite rollout|loop --update-readme``
rewrites (the ``demo`` block is the README's)."""


# -- helpers --------------------------------------------------------------------------------------
_REPO_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\((?![a-z][a-z0-9+.-]*:|#)[^)]*\)")


def unlinked(block: str) -> str:
    """``block`` with each link to a repository file replaced by its text, for a documentation
    page (the strict site build refuses links outside ``docs/``; the text names the file).

    >>> unlinked("from [`a/results.md`](a/results.md), see [x](https://e.org)")
    'from `a/results.md`, see [x](https://e.org)'
    """
    return _REPO_LINK.sub(r"\1", block)


def _run_rollout_suite(args: RunArgs, out: Path) -> dict[str, Any]:
    from benchmarks.throughput import rollout_bench

    result = rollout_bench.run_rollout_suite(
        out_dir=out, model=args.model, seed=args.seed, precision=args.precision
    )
    print(json.dumps(result, indent=2, default=str))
    return result


# -- the run --------------------------------------------------------------------------------------
def run(args: RunArgs, *, pm: Any = None) -> dict[str, Any]:
    """Run the benchmark and write its files; returns the results dict.

    Args:
        args: the options.
        pm: the plugin manager to find tasks in (default: a fresh one with the installed plugins).
    """
    started = time.time()
    reward_overrides = {k.removeprefix("reward."): v for k, v in configtree.parse_sets(args.set).items()}
    bench_config(args)  # a bad --set name or value fails here, before any model is loaded
    task_args(args.task_arg)  # so does a malformed --task-arg
    if args.threads is not None and args.model != "scripted":
        import torch

        torch.set_num_threads(args.threads)
    if args.data_dir:
        os.environ["OPTIMA_DATA_DIR"] = args.data_dir
    suite = get_suite(args.suite)
    checkpoints = checkpoint_specs(args.checkpoint)
    backend = args.backend or suite.backend
    check_backend_flags(args.model, backend, base_urls=args.base_url)
    check_paths(args, backend, checkpoints)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_name = f"{suite.name}__{Path(args.model).name}__{args.seed}__{stamp}"
    out = Path(args.out) if args.out else _unused(Path("results") / run_name)
    try:
        if suite.name == "demo":
            return _demo(args, suite, out)
        if suite.name in ("rollout", "loop", "handoff"):
            out.mkdir(parents=True, exist_ok=True)
            with folder_lock(out, what="--out"):
                return _throughput(args, suite, out)
        return evaluate(args, suite, out, started, checkpoints, backend=backend, pm=pm,
                        reward_overrides=reward_overrides)  # fmt: skip
    except KeyboardInterrupt:
        raise Interrupted(" ".join(command_line(dataclasses.replace(args, out=str(out))))) from None


def _unused(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... when a run of the same second took it."""
    n = 1
    candidate = path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run: carries the command that resumes it."""

    def __init__(self, resume: str) -> None:
        super().__init__(resume)
        self.resume = resume


def _throughput(args: RunArgs, suite: Any, out: Path) -> dict[str, Any]:
    """The rollout, loop and handoff suites (engine, training-loop and stage-handoff timings)."""
    if args.update_readme and suite.name == "handoff":
        raise RunConfigError("--update-readme: the handoff suite has no generated block; drop the flag")
    if suite.name == "rollout":
        result = _run_rollout_suite(args, out)
    elif suite.name == "handoff":
        from benchmarks.throughput.handoff_bench import run_handoff_suite

        command = " ".join(command_line(dataclasses.replace(args, out=str(out))))
        result = run_handoff_suite(out, model=args.model, seed=args.seed, repetitions=args.episodes or 3,
                                   command=command)  # fmt: skip
    else:
        from benchmarks.throughput.loop_bench import run_loop_suite

        result = run_loop_suite(out, model=args.model, seed=args.seed)
    write_text_atomic(
        out / "command.txt", " ".join(command_line(dataclasses.replace(args, out=str(out)))) + "\n"
    )
    if args.update_readme:
        update_performance_page({suite.name: out})
    return result


def update_performance_page(results: dict[str, Path], page: Path = PERFORMANCE_PAGE) -> None:
    """Rewrite ``page``'s performance block from the committed suites' results, ``results`` (suite
    name to results folder) replacing theirs."""
    from benchmarks.reports.readme import SUITES, performance_block, replace_block

    folders = {s: REPO_README.parent / "benchmarks" / "results" / s for s in SUITES}
    replace_block(page, "performance", unlinked(performance_block({**folders, **results})))


def _demo(args: RunArgs, suite: Any, out: Path) -> dict[str, Any]:
    """The demo suite (:mod:`benchmarks.demo.suite`: trains, then evaluates; resumable)."""
    from benchmarks.demo.suite import run_demo

    return run_demo(
        out,
        names=args.task,
        concurrency=suite_concurrency(args, suite),
        update_readme_path=REPO_README if args.update_readme else None,
        command=" ".join(command_line(args)),
        demo_command=" ".join(command_line(dataclasses.replace(args, task=()))),
        git_commit=checkout_commit() or "unknown",
        threads=args.threads,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (:mod:`optima_env.cli_support`: 0 ok, 2 on an expected
    error, 130 when interrupted, with the command that resumes, 1 on a bug)."""
    setup_logging(fmt="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = list(sys.argv[1:] if argv is None else argv)

    def body() -> None:
        args, ns = parse_command(argv)
        setup_logging(ns, fmt="%(levelname)s %(name)s: %(message)s")
        results = run(args)
        if args.suite != "demo" and not args.allow_missing:
            require_evaluated(results)

    def interrupted(exc: KeyboardInterrupt) -> str:
        if isinstance(exc, Interrupted):
            return f"interrupted; finished episodes are kept: rerun {exc.resume} to resume"
        return "interrupted before the run started; nothing was written"

    with progress_silenced("--no-progress" in argv):  # before any library creates a bar
        return run_command(body, argv=argv, on_interrupt=interrupted)


if __name__ == "__main__":
    raise SystemExit(main())
