"""Train (or resume) one run of the demo's recipe, alone: ``python -m benchmarks.demo.train_one``.

::

    python -m benchmarks.demo.train_one synth idpo --threads 1
    python -m benchmarks.demo.train_one synth isft-dpo --threads 1 --after idpo

The run is the one ``python -m benchmarks.run --suite demo`` trains, in the same folder
(``<out>/<task>/train/<trainer>``, :func:`benchmarks.demo.train.train_run`), so the demo later
resumes it: finished, it trains nothing again and goes on to export and evaluate. This is how the
runs of a task train side by side, one process each (on this machine's 2 cores, two processes of one
thread each generated 1.65x what one process does, ``benchmarks/results/rollout/results.md``), where
the demo trains them one after the other. ``--after TRAINER`` waits until that run has finished the
shared initialization (M_0), then adopts it instead of training it again. The compute is counted
from the stages' own timings, as the demo counts it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.demo.tasks import DEMO_TASKS
from optima_env.errors import OptimaError

__all__ = ["main"]

COMMAND = "python -m benchmarks.demo.train_one"
_POLL_S = 30.0


def _parser() -> argparse.ArgumentParser:
    names = [s.name for s in DEMO_TASKS]
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n")[0])
    parser.add_argument("task", help=f"a demo task: {', '.join(names)}")
    parser.add_argument("trainer", help="one of the task's trainers (isft, idpo, isft-dpo)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/demo"), help="the demo's folder")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--after", default=None, help="wait for this run's initialization (M_0), then adopt it"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    spec = next((s for s in DEMO_TASKS if args.task in (s.name, s.task)), None)
    if spec is None:
        print(f"{COMMAND}: no demo task {args.task!r}; expected one of "
              f"{', '.join(s.name for s in DEMO_TASKS)}", file=sys.stderr)  # fmt: skip
        return 2
    for trainer in (args.trainer, args.after):
        if trainer is not None and trainer not in spec.trainers:
            trains = ", ".join(spec.trainers)
            print(f"{COMMAND}: {spec.name} trains {trains}; got {trainer!r}", file=sys.stderr)
            return 2
    if args.threads is not None:
        if args.threads < 1:
            print(f"{COMMAND}: --threads must be at least 1, got {args.threads}", file=sys.stderr)
            return 2
        import torch

        torch.set_num_threads(args.threads)
    from benchmarks.demo.train import init_result, train_run
    from optima_trainers.run.folder import wait_for

    root = args.out / spec.name
    if args.after:
        result = init_result(spec, root, args.after)
        if result is None:
            print(f"{COMMAND}: {args.after} has no initialization stage to wait for", file=sys.stderr)
            return 2
        if not result.is_file():
            print(f"[{spec.name} {args.trainer}] waiting for {args.after}'s M_0 ({result})", flush=True)
            wait_for(result, poll_s=_POLL_S)
    started = time.perf_counter()
    try:
        run = train_run(spec, root, args.trainer, progress=not args.no_progress)
    except OptimaError as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        return 2
    shared = f" (initialization adopted: {run.shared})" if run.shared else ""
    took = time.perf_counter() - started
    print(f"[{spec.name} {args.trainer}] {len(run.stages)} stages done{shared} in "
          f"{took:.0f} s; stage compute {run.compute_s():.0f} s", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
