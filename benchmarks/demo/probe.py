"""The demo's probe: one iteration of iSFT on a few dozen instances of the main task, then every
stage beside the controls on held-out instances, before hours go into the full runs.

    python -m benchmarks.demo.probe --out benchmarks/results/probe

It trains ``isft`` (the initialization M_0 and one iteration, with the main task's recipe and
``--instances`` training instances) into ``<out>/train/isft`` and plays, on the first ``--eval``
held-out instances, greedy and with the demo's caps: MAD, CoT, the final-hop holder alone, and
each stage with and without the counterfactual (its first agent's evidence from another
instance). The report (``<out>/report.md``) is the demo's table with its controls. A rerun with
the same ``--out`` resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from benchmarks.demo.tasks import MAIN_TASK, DemoTask, eval_settings, stage_label
from benchmarks.evaluation.methods import build_methods, with_controls
from optima_env.configtree import parse_sets
from optima_trainers.run.provenance import git_commit

__all__ = ["evaluate_probe", "main", "probe_task"]


def probe_task(instances: int, eval_instances: int, sets: dict[str, str] | None = None) -> DemoTask:
    """The main task's recipe, cut to the probe: iSFT, the initialization and one iteration on
    ``instances`` training instances, evaluated on ``eval_instances``; ``sets`` (dotted training
    fields, as ``--set`` of ``optima-train``) tries another recipe."""
    return dataclasses.replace(
        MAIN_TASK,
        name=f"{MAIN_TASK.name}-probe",
        trainers=("isft",),
        train={**MAIN_TASK.train, "generation.instances": instances, **(sets or {})},
        train_by_trainer={"isft": {"iterations": 2}},
        eval_instances=eval_instances,
        stage_instances=eval_instances,
        scaling_instances=0,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.demo.probe", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="the probe's folder (resumed when it exists)")
    parser.add_argument("--instances", type=int, default=32, help="training instances of each stage")
    parser.add_argument("--eval", type=int, default=30, help="held-out instances of the evaluation")
    parser.add_argument("--train-only", action="store_true", help="train, do not evaluate")
    parser.add_argument("--summary", action="store_true", help="print the sampled stages' summary only")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="another recipe: a training field by its dotted name (as optima-train --set)")
    args = parser.parse_args(argv)
    spec = probe_task(args.instances, args.eval, parse_sets(args.set))
    if args.summary:
        print(sampled_summary(spec, args.out))
        return 0
    from benchmarks.demo.train import train_run
    from optima_env.errors import EmptySelectionError

    try:
        run = train_run(spec, args.out, "isft", progress=False)
    except EmptySelectionError as exc:
        print(f"the probe stopped: {exc}", flush=True)
        print(sampled_summary(spec, args.out))
        return 1
    print("stages:", ", ".join(f"{name} -> {path}" for name, path in run.stages), flush=True)
    if args.train_only:
        return 0
    print(evaluate_probe(spec, args.out, run))
    return 0


def sampled_summary(spec: DemoTask, out: Path) -> str:
    """Each sampled stage's conversations in ``<out>/train/isft``, so a stage that selects nothing,
    or only guesses, says so: how many, their tokens, how many the metric credits, how often the
    first agent said the bridging entity (the chain's first object: the person's employer) and how
    many credited conversations it said it in, and the credit that guessing would earn: the final
    answers that name exactly one candidate, divided by the number of candidates in the final-hop
    holder's table (the task's ``num_candidates``, K)."""
    from optima_env import make_task
    from optima_env.io import read_episodes
    from optima_env.scoring.candidates import named_candidates

    task = make_task(spec.task, **dict(spec.task_kwargs))
    lines = []
    for stage in sorted((out / "train" / "isft").glob("iter_*/episodes.jsonl")):
        episodes = read_episodes(stage)
        said = credited = credited_said = one_named = 0
        for e in episodes:
            split, index = e.sample_id.split("-")[-2:]
            sample = task.sample(split, int(index))
            bridge = sample.metadata["chain"][0][2]
            candidates = sample.metadata["candidates"]
            told = any(bridge in t.text for t in e.turns if t.agent == task.agents[0])
            said += told
            credited += e.task_score > 0
            credited_said += e.task_score > 0 and told
            one_named += len(named_candidates(e.final_answer or "", candidates)) == 1
        tokens = sum(e.num_tokens for e in episodes) / max(len(episodes), 1)
        guess = one_named / task.num_candidates
        lines.append(f"{stage.parent.name}: {len(episodes)} sampled conversations, {tokens:.1f} tokens each; "
                     f"{credited} credited by {task.scorer_name()}, the first agent said the bridging entity "
                     f"in {said} of all and in {credited_said} of the credited; {one_named} final answers "
                     f"name exactly one candidate, so guessing among the K = {task.num_candidates} would be "
                     f"credited about {guess:.1f} times")  # fmt: skip
    return "\n".join(lines)


def evaluate_probe(spec: DemoTask, out: Path, run: Any) -> str:
    """Play the probe's systems and controls on the held-out instances into ``<out>/eval``
    (resumable) and return the table and the controls."""
    from benchmarks.demo.suite import play_folder
    from benchmarks.evaluation.controls import controls_table
    from benchmarks.reports.intervals import add_intervals, ratio_table

    settings = eval_settings(spec)
    stages = {stage_label(run.trainer, stage): path for stage, path in run.stages}
    methods = with_controls(build_methods(("cot", "mad"), stages, settings), settings)
    provenance = {"git_commit": git_commit(Path(__file__).resolve().parents[2]) or "unknown",
                  "command": ["python", "-m", "benchmarks.demo.probe", "--out", str(out)]}  # fmt: skip
    results = play_folder(spec, out / "eval", methods, settings, spec.eval_instances, concurrency=32,
                          provenance=provenance)  # fmt: skip
    add_intervals(results["rows"], base_key="mad")
    return ratio_table(results["rows"]) + "\n\n" + controls_table(results)


if __name__ == "__main__":
    raise SystemExit(main())
