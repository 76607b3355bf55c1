"""Command line of the task conformance checks: ``python -m optima_env.check TASK``.

Runs :func:`optima_env.testing.check_task` on a registered task (its checks, then PettingZoo's
``api_test``, ``seed_test`` and ``parallel_api_test``) and prints one line per check as it
passes::

    python -m optima_env.check ie/synth-v0
    python -m optima_env.check my/task-v0 --split train --task-arg hops=3
    python -m optima_env.check hotpotqa --data-dir data/

A failing check is one ``error:`` line naming the check, what was expected and what was got, exit
status 2 (the checks that passed before it are printed above it); an unknown task, a bad
``--task-arg`` or missing data is one line and exit 2 too (:mod:`optima_env.cli_support`).
"""

from __future__ import annotations

import os
import sys

from optima_env.cli_support import Parser, add_common_flags, run_command, setup_logging, task_args

__all__ = ["main"]


def _parser() -> Parser:
    parser = Parser("python -m optima_env.check", __doc__)
    parser.add_argument("task", help="a registered task id or unique name, e.g. ie/synth-v0")
    parser.add_argument(
        "--split", default="test", help="the split whose instances are checked (default: test)"
    )
    parser.add_argument(
        "--task-arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a task factory argument (repeatable); VALUE is read as JSON when it parses, else as text",
    )
    parser.add_argument(
        "--samples", type=int, default=3, help="instances whose views and scores are checked (default: 3)"
    )
    parser.add_argument(
        "--cycles", type=int, default=20, help="num_cycles of PettingZoo's tests (default: 20)"
    )
    parser.add_argument("--data-dir", default=None, help="benchmark data folder (sets OPTIMA_DATA_DIR)")
    add_common_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0: every check passed; 2: one failed, or bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()

    def body() -> None:
        from optima_env.errors import ConfigError
        from optima_env.paths import check_input_folder
        from optima_env.registry import get_plugin_manager, resolve_task_id
        from optima_env.testing import check_task

        ns = _parser().parse_args(argv)
        setup_logging(ns)
        for flag, value in (("--samples", ns.samples), ("--cycles", ns.cycles)):
            if value < 1:
                raise ConfigError(f"{flag} must be at least 1, got {value}; pass {flag} 1 or more")
        if ns.data_dir:
            check_input_folder("--data-dir", ns.data_dir)
            os.environ["OPTIMA_DATA_DIR"] = ns.data_dir
        pm = get_plugin_manager()
        task_id = resolve_task_id(ns.task, pm)
        report = check_task(
            task_id,
            pm=pm,
            split=ns.split,
            task_kwargs=task_args(tuple(ns.task_arg)),
            num_samples=ns.samples,
            api_cycles=ns.cycles,
            on_pass=lambda check, detail: print(f"ok  {check:13s} {detail}".rstrip(), flush=True),
        )
        print(f"{report.task_id}: every check passed ({', '.join(report.checks)})")

    return run_command(body, argv=argv, on_interrupt="interrupted; nothing was written")


if __name__ == "__main__":
    raise SystemExit(main())
