"""Evaluate a multi-agent system on optima tasks and print a table of score and tokens.

With no arguments: the embedded task (``ie/synth-v0``) played by the embedded model
(SmolLM2-135M-Instruct) as a 2-agent system, greedy, on a few held-out instances. Writes, under
``--out`` (default ``results/<run name>/``):

* ``episodes.jsonl``: every episode (turns, answer, tokens, reward breakdown), appended as it ends;
* ``results.json`` and ``results.md``: the table, with the run's configuration.

Examples::

    python -m benchmarks.run
    python -m benchmarks.run --task ie/synth-v0 --episodes 8 --seed 1
    python -m benchmarks.run --model scripted --episodes 3     # no model: plumbing check
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optima_env import RewardConfig, make_task, resolve_task_id
from optima_env.errors import OptimaError
from optima_env.io import append_jsonl, write_json_atomic, write_text_atomic
from optima_env.policy import ChatPolicy, GenerationRequest, SamplingParams, ScriptedPolicy
from optima_env.rollout import make_jobs, rollout

logger = logging.getLogger("benchmarks.run")


@dataclass(frozen=True, kw_only=True)
class RunArgs:
    """Options of one benchmark run (each becomes a ``--flag``)."""

    task: str = "ie/synth-v0"
    """Task id (or a unique name such as ``synth``)."""
    model: str = "embedded"
    """``embedded``, a Hugging Face model name or local folder, or ``scripted`` (no model)."""
    episodes: int = 4
    """Instances to evaluate (the first N of the split)."""
    split: str = "test"
    """Data split to evaluate on."""
    seed: int = 0
    """Seed of the episodes (evidence dealing, sampling)."""
    max_turns: int = 6
    """Turns per conversation before truncation (the paper uses 10)."""
    max_new_tokens: int = 96
    """Token cap of one generated turn."""
    temperature: float = 0.0
    """Sampling temperature (0 = greedy, as the paper evaluates)."""
    concurrency: int = 16
    """Episodes generated together in one batch."""
    data_dir: str | None = None
    """Benchmark data folder (default: $OPTIMA_DATA_DIR)."""
    out: str | None = None
    """Output folder (default: results/<task>__<model>__<seed>__<time>)."""


def parse_args(argv: list[str] | None = None) -> RunArgs:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    docs = _field_docs()
    for f in dataclasses.fields(RunArgs):
        flag = "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
        parser.add_argument(
            flag, type=kind, default=f.default, help=f"{docs.get(f.name, '')} (default: {f.default})"
        )
    ns = parser.parse_args(argv)
    return RunArgs(**vars(ns))


def _field_docs() -> dict[str, str]:
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(RunArgs))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        ):
            docs[node.target.id] = str(nxt.value.value)  # type: ignore[union-attr]
    return docs


def _scripted_policy() -> ChatPolicy:
    """Answers with the first fact line it holds, so episodes run end to end without a model."""

    def reply(request: GenerationRequest) -> str:
        return "<A>unknown</A>"

    return ScriptedPolicy(reply)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _markdown_table(rows: list[dict[str, Any]]) -> str:
    header = "| task | method | score | mean #tokens | episodes |\n|---|---|---|---|---|\n"
    lines = [
        f"| {r['task']} | {r['method']} | {r['score']:.3f} | {r['mean_tokens']:.1f} | {r['episodes']} |"
        for r in rows
    ]
    return header + "\n".join(lines) + "\n"


def run(args: RunArgs) -> dict[str, Any]:
    """Run the benchmark and write its files; returns the results dict."""
    started = time.time()
    if args.data_dir:
        os.environ["OPTIMA_DATA_DIR"] = args.data_dir
    task_id = resolve_task_id(args.task)
    task = make_task(task_id)
    run_name = (
        f"{task_id.replace('/', '_')}__{Path(args.model).name}__{args.seed}__{time.strftime('%Y%m%d-%H%M%S')}"
    )
    out = Path(args.out or Path("results") / run_name)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = None
    if args.model == "scripted":
        policy = _scripted_policy()
    else:
        from optima_env.backends.hf import TransformersPolicy

        policy = TransformersPolicy.from_pretrained(args.model, batch_size=args.concurrency)
        tokenizer = policy.tokenizer  # type: ignore[attr-defined]

    samples = task.samples(args.split)
    count = min(args.episodes, len(samples))
    jobs = make_jobs(range(count), num_samples=1, seed=args.seed)
    episodes_path = out / "episodes.jsonl"
    episodes_path.unlink(missing_ok=True)
    env_kwargs = dict(
        split=args.split, max_turns=args.max_turns, tokenizer=tokenizer, reward_config=RewardConfig()
    )
    sampling = SamplingParams(
        temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed
    )
    episodes = rollout(
        task,
        policy,
        jobs=jobs,
        sampling=sampling,
        concurrency=args.concurrency,
        env_kwargs=env_kwargs,
        on_episode=lambda _pos, ep: append_jsonl(episodes_path, [ep.to_dict()]),
        progress=True,
    )
    method = "MAD (untrained 2-agent)" if args.model != "scripted" else "scripted"
    row = {
        "task": task_id,
        "method": method,
        "score": sum(e.task_score for e in episodes) / max(len(episodes), 1),
        "mean_tokens": sum(e.num_tokens for e in episodes) / max(len(episodes), 1),
        "episodes": len(episodes),
    }
    results = {
        "rows": [row],
        "config": dataclasses.asdict(args),
        "model": args.model,
        "git_commit": _git_commit(),
        "wall_time_s": round(time.time() - started, 1),
    }
    write_json_atomic(out / "results.json", results)
    table = _markdown_table([row])
    write_text_atomic(
        out / "results.md",
        f"# Benchmark {run_name}\n\n{table}\nConfig: `{json.dumps(dataclasses.asdict(args))}`\n",
    )
    print(table)
    print(f"wrote {out}/episodes.jsonl, results.json, results.md ({results['wall_time_s']} s)")
    return results


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    try:
        run(args)
    except OptimaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
