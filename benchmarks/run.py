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
from benchmarks.demo.tasks import MAIN_TASK
from benchmarks.evaluation.controls import add_controls, controls_table, has_controls
from benchmarks.evaluation.methods import PlaySettings, build_methods, with_controls
from benchmarks.evaluation.outputs import collect_results, require_evaluated, write_outputs
from benchmarks.evaluation.policies import check_backend_flags, token_counter_description
from benchmarks.evaluation.store import EpisodeStore
from benchmarks.evaluation.trained import trained_rules, trained_task_kwargs
from benchmarks.evaluation.units import open_task, play_methods
from benchmarks.reports.intervals import add_intervals, ratio_table
from benchmarks.suites import get_suite
from optima_env import configtree
from optima_env.backends.peft_adapter import is_adapter
from optima_env.cli_support import progress_silenced, run_command, setup_logging
from optima_env.io import write_json_atomic, write_text_atomic
from optima_env.paths import folder_lock
from optima_trainers.run.provenance import git_commit

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
_WRITTEN_BY_RUNS = ("benchmarks/results/", "README.md", "docs/benchmarks/performance.md")
"""Tracked paths that benchmark runs write themselves (results, the generated blocks): changes there
do not make a checkout dirty for :func:`_git_commit`."""


_REPO_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\((?![a-z][a-z0-9+.-]*:|#)[^)]*\)")


def unlinked(block: str) -> str:
    """``block`` with each link to a repository file replaced by its text, for a documentation
    page (the strict site build refuses links outside ``docs/``; the text names the file).

    >>> unlinked("from [`a/results.md`](a/results.md), see [x](https://e.org)")
    'from `a/results.md`, see [x](https://e.org)'
    """
    return _REPO_LINK.sub(r"\1", block)


def _git_commit(root: Path | None = None) -> str | None:
    """HEAD's commit of the checkout at ``root`` (default: this one), with ``-dirty`` when tracked
    files other than the runs' own outputs differ from it (the recorded commit then does not hold
    the code or recipe that ran)."""
    return git_commit(root or Path(__file__).resolve().parents[1], ignore=_WRITTEN_BY_RUNS)


def _suite_adapters(suite: Any, task_ids: list[str]) -> dict[str, str]:
    """The suite's trained systems whose adapter folders exist (a missing one is a notice), when
    every task of the run is the one they were trained on (``MAIN_TASK``); none otherwise."""
    if not suite.adapters:
        return {}
    if any(t != MAIN_TASK.task for t in task_ids):
        logger.info(
            "the %s suite's trained adapters are left out: they were trained on %s, not on %s "
            "(pass --checkpoint NAME=PATH for models trained on your task)",
            suite.name, MAIN_TASK.task, ", ".join(t for t in task_ids if t != MAIN_TASK.task),
        )  # fmt: skip
        return {}
    found = {}
    for label, folder in suite.adapters:
        if is_adapter(folder):
            found[label] = folder
        else:
            logger.warning(
                "%s: no adapter at %s (the demo suite writes it: python -m benchmarks.run --suite demo); "
                "its row is left out",
                label,
                folder,
            )
    return found


def _concurrency(args: RunArgs, suite: Any) -> int:
    return suite.concurrency if args.concurrency is None else args.concurrency


def _check_resume(out: Path, identity: dict[str, Any]) -> None:
    path = out / "run_config.json"
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        diff = {k: (old.get(k), v) for k, v in identity.items() if old.get(k) != v and k in old}
        if diff:
            changes = "; ".join(f"{k}: {a!r} in the folder, {b!r} now" for k, (a, b) in diff.items())
            raise RunConfigError(
                f"--out {out} holds a run with other generation settings ({changes}); "
                "use another --out, or rerun with the folder's settings to resume it"
            )
        identity = {**old, **identity}
    write_json_atomic(path, identity)


def results_started(timestamp: float) -> str:
    """A timestamp as ISO 8601 local time."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(timestamp))


def _previous_invocations(out: Path) -> list[dict[str, Any]]:
    """The invocations recorded by earlier runs in ``out`` (resumed runs keep their history)."""
    try:
        previous = json.loads((out / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    invocations = previous.get("invocations") if isinstance(previous, dict) else None
    return [i for i in invocations if isinstance(i, dict)] if isinstance(invocations, list) else []


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
        return _evaluate(args, suite, out, started, checkpoints, backend=backend, pm=pm,
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
        concurrency=_concurrency(args, suite),
        update_readme_path=REPO_README if args.update_readme else None,
        command=" ".join(command_line(args)),
        demo_command=" ".join(command_line(dataclasses.replace(args, task=()))),
        git_commit=_git_commit() or "unknown",
        threads=args.threads,
    )


def _evaluate(
    args: RunArgs,
    suite: Any,
    out: Path,
    started: float,
    checkpoints: dict[str, str],
    *,
    backend: str,
    pm: Any,
    reward_overrides: dict[str, Any],
) -> dict[str, Any]:
    """The evaluation suites (main, smoke, paper, scaling): open the tasks, then play and report.
    Checkpoints from a training run folder set the caps and their task's arguments (flags win)."""
    rules = trained_rules(checkpoints)
    caps = rules or suite
    settings = PlaySettings(
        max_turns=args.max_turns or caps.max_turns,
        max_new_tokens=args.max_new_tokens or caps.max_new_tokens,
        temperature=args.temperature,
        sc_n=args.sc_n or suite.sc_n,
        sc_temperature=args.sc_temperature,
        scaling_k=args.scaling_k or suite.scaling_k,
        scaling_temperature=args.scaling_temperature,
        seed=args.seed,
        stop_at_speaker_tags=caps.stop_at_speaker_tags,
    )
    explicit = bool(args.task)
    task_names = tuple((t,) for t in args.task) if explicit else suite.tasks
    entries = [
        open_task(
            names,
            explicit=explicit,
            suite=suite,
            split=args.split,
            episodes=args.episodes,
            pm=pm,
            reward=reward_overrides,
            task_kwargs={**(suite.task_kwargs.get(names[0]) or {}), **trained_task_kwargs(rules, names, pm),
                         **task_args(args.task_arg)},
        )
        for names in task_names
    ]
    if not checkpoints and args.model == "embedded":  # the adapters' base model
        checkpoints = _suite_adapters(suite, [e.task for e in entries])
    methods = build_methods(args.methods or suite.methods, checkpoints, settings, scaling=suite.scaling)
    tasks = [e.obj for e in entries if e.obj is not None]
    if not suite.scaling and (args.controls or (suite.controls and all(has_controls(t) for t in tasks))):
        methods = with_controls(methods, settings)  # the suite's only where every task has them

    out.mkdir(parents=True, exist_ok=True)
    given = [f for f, v in (("--max-turns", args.max_turns), ("--max-new-tokens", args.max_new_tokens)) if v]
    caps_from = ("the suite" if rules is None else "the training run of " + "; ".join(rules.runs)) + (
        f", except {' and '.join(given)}" if given else ""
    )
    with folder_lock(out, what="--out"):
        return _play_and_report(args, suite, out, started, settings, checkpoints, methods, entries,
                                backend=backend, reward_overrides=reward_overrides,
                                caps_from=caps_from)  # fmt: skip


# size: the run's resolved options, forwarded from its CLI to play and report
def _play_and_report(
    args: RunArgs,
    suite: Any,
    out: Path,
    started: float,
    settings: PlaySettings,
    checkpoints: dict[str, str],
    methods: list[Any],
    entries: list[Any],
    *,
    backend: str,
    reward_overrides: dict[str, Any],
    caps_from: str,
) -> dict[str, Any]:
    """Play what ``--out`` does not hold yet and write the outputs (under the folder's lock).
    Eleven parameters: the run's pieces as :func:`run` resolved them, passed on unchanged."""
    data_dir = os.environ.get("OPTIMA_DATA_DIR")
    identity = {
        "model": args.model,
        "backend": backend,
        "split": args.split,
        "data_dir": data_dir,
        "settings": {k: v for k, v in dataclasses.asdict(settings).items() if k not in ("sc_n", "scaling_k")},
        "reward": dict(sorted(reward_overrides.items())),
        "task_kwargs": {k: dict(v) for k, v in suite.task_kwargs.items()},
        **({"task_args": task_args(args.task_arg)} if args.task_arg else {}),
        **{f"checkpoint:{k}": v for k, v in checkpoints.items()},
        **hf_options(args, backend),
    }
    _check_resume(out, identity)
    store = EpisodeStore(out / "episodes.jsonl")
    resumed = len(store)

    play_methods(
        methods, entries, store, settings=settings, split=args.split,
        concurrency=_concurrency(args, suite),
        backend=backend, default_model=args.model,
        policy_options={"base_urls": args.base_url, "api_key_env": args.api_key_env or None,
                        "tokenizer": args.tokenizer, **vllm_options(args, backend),
                        **hf_options(args, backend)},
    )  # fmt: skip

    wall = round(time.time() - started, 1)
    results = collect_results(entries, methods, store)
    add_intervals(results["rows"], base_key="mad")
    add_controls(results, entries)
    results.update(
        run_name=out.name,
        suite=f"custom: --task {','.join(args.task)}, {suite.name}'s settings" if args.task else suite.name,
        model=args.model,
        backend=backend if args.model != "scripted" else "scripted",
        token_counter=token_counter_description(args.model, backend, args.tokenizer),
        data_dir=data_dir,
        split=args.split,
        settings={**dataclasses.asdict(settings), "caps_from": caps_from},
        config=dataclasses.asdict(args),
        git_commit=_git_commit(),
        started=results_started(started),
        command=command_line(dataclasses.replace(args, out=str(out))),
        units={"generated": len(store) - resumed, "resumed": resumed},
        wall_time_s=wall,
        invocations=[
            *_previous_invocations(out),
            {"started": results_started(started), "wall_time_s": wall, "generated": len(store) - resumed},
        ],
    )
    table = write_outputs(out, results, store, viewer_limit=args.viewer_limit)
    print(table)
    if any(r.get("score_ratio") is not None for r in results["rows"]):
        print("\nScores and tokens with 95% bootstrap intervals, ratios to MAD (paired):\n")
        print(ratio_table(results["rows"]))
    controls = controls_table(results)
    if controls:
        print("\nControls (what a system scores without passing the evidence on):\n")
        print(controls)
    print(f"wrote {out}/ episodes.jsonl, results.json, report.md, viewer.html ({results['wall_time_s']} s)")
    return results


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
