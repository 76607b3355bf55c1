"""The evaluation suites' run (``main``, ``smoke``, ``paper``, ``scaling``) behind
:mod:`benchmarks.run`: open the tasks, play what ``--out`` does not hold yet (resumable), and
write the results, the report and the viewer. The command's other suites (``rollout``, ``loop``,
``handoff``, ``demo``) are dispatched by :mod:`benchmarks.run` itself.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.args import RunArgs, RunConfigError, command_line, hf_options, task_args, vllm_options
from benchmarks.demo.tasks import MAIN_TASK
from benchmarks.evaluation.controls import add_controls, controls_table, has_controls
from benchmarks.evaluation.methods import PlaySettings, build_methods, with_controls
from benchmarks.evaluation.outputs import collect_results, write_outputs
from benchmarks.evaluation.policies import token_counter_description
from benchmarks.evaluation.store import EpisodeStore
from benchmarks.evaluation.trained import trained_rules, trained_task_kwargs
from benchmarks.evaluation.units import open_task, play_methods
from benchmarks.reports.intervals import add_intervals, ratio_table
from optima_env.backends.peft_adapter import is_adapter
from optima_env.io import write_json_atomic
from optima_env.paths import folder_lock
from optima_trainers.run.provenance import git_commit

__all__ = ["checkout_commit", "evaluate", "results_started", "suite_adapters", "suite_concurrency"]

logger = logging.getLogger("benchmarks.run")  # the command's: its log lines name it, as before the split

_WRITTEN_BY_RUNS = ("benchmarks/results/", "README.md", "docs/benchmarks/performance.md")
"""Tracked paths that benchmark runs write themselves (results, the generated blocks): changes there
do not make a checkout dirty for :func:`checkout_commit`."""


def checkout_commit(root: Path | None = None) -> str | None:
    """HEAD's commit of the checkout at ``root`` (default: this one), with ``-dirty`` when tracked
    files other than the runs' own outputs differ from it (the recorded commit then does not hold
    the code or recipe that ran)."""
    return git_commit(root or Path(__file__).resolve().parents[1], ignore=_WRITTEN_BY_RUNS)


def suite_adapters(suite: Any, task_ids: list[str]) -> dict[str, str]:
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


def suite_concurrency(args: RunArgs, suite: Any) -> int:
    """Episodes in flight: ``--concurrency`` where given, else the suite's."""
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


def evaluate(
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
            task_kwargs={
                **(suite.task_kwargs.get(names[0]) or {}),
                **trained_task_kwargs(rules, names, pm),
                **task_args(args.task_arg),
            },
        )
        for names in task_names
    ]
    if not checkpoints and args.model == "embedded":  # the adapters' base model
        checkpoints = suite_adapters(suite, [e.task for e in entries])
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
    Eleven parameters: the run's pieces as :func:`benchmarks.run.run` resolved them, passed on unchanged."""
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
        concurrency=suite_concurrency(args, suite),
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
        git_commit=checkout_commit(),
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
