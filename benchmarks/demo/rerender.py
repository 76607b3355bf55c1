"""Re-render the demo's tables from its committed results, without running any model:
``python -m benchmarks.demo.rerender [OUT] [--update-readme]`` (default ``benchmarks/results/demo``;
``--update-readme``: also the README's demo block, from the current folder's ``README.md``).

For each evaluated task of ``OUT/demo.json`` it reads the per-instance rows of the table
(``<task>/eval/results.json``) and of the stages (``<task>/stages/results.json``), recomputes
their intervals, ratios to MAD and paired differences to M_0 (:mod:`benchmarks.demo.control`),
and rewrites ``demo.json`` and ``report.md``; everything else (curves, compute, adapters, plots)
is kept as the demo wrote it. Use it after a change to how the tables are computed, when the
episodes are unchanged; ``python -m benchmarks.run --suite demo`` remains the command that
reproduces the results themselves.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.demo.control import control_label
from benchmarks.demo.report import readme_block, render_report, table_rows
from benchmarks.demo.tasks import DEMO_TASKS, trainer_label
from benchmarks.reports.readme import replace_block
from optima_env.errors import DataError
from optima_env.io import read_json_object, write_json_atomic, write_text_atomic

__all__ = ["rerender"]

COMMAND = "python -m benchmarks.demo.rerender"


class _Run:
    """The first run of a task as :func:`~benchmarks.demo.control.control_label` reads it."""

    def __init__(self, trainer: str, stages: Sequence[str]) -> None:
        self.trainer, self.stages = trainer, tuple((s, "") for s in stages)


def _control(summary: Mapping[str, Any]) -> str | None:
    """M_0's row label: the first trainer's first stage, as the task's curves name it."""
    spec = next((s for s in DEMO_TASKS if s.name == summary.get("name")), None)
    if spec is None or not spec.trainers:
        return None
    points = summary.get("curves", {}).get(trainer_label(spec.trainers[0]), [])
    return control_label([_Run(spec.trainers[0], [p["stage"] for p in points])])


def _task(out: Path, summary: dict[str, Any]) -> dict[str, Any]:
    root, control = out / summary["name"], _control(summary)
    finals = {r["method"]: r.get("final_of") for r in summary["rows"]}
    rows, missing = table_rows(read_json_object(root / "eval" / "results.json"), control)
    for row in rows:
        row["final_of"] = finals.get(row["method"])
    stage_rows, stages_missing = table_rows(read_json_object(root / "stages" / "results.json"), control)
    missing_by_table = {k: v for k, v in (("table", missing), ("stages", stages_missing)) if v}
    key = (summary.get("name"), summary.get("task"))
    spec = next((s for s in DEMO_TASKS if (s.name, s.task) == key), None)
    words = {"retired": spec.retired, "caption": spec.caption} if spec is not None else {}
    return {**summary, "rows": rows, "stage_rows": stage_rows, "control": control,
            "control_missing": missing_by_table, **words}  # fmt: skip


def rerender(out: Path, *, readme: Path | None = None) -> dict[str, Any]:
    """Recompute the tables of ``out/demo.json`` from the committed results; rewrite it,
    ``report.md`` and (with ``readme``) the README's demo block; returns the new ``demo.json``."""
    demo = read_json_object(out / "demo.json")
    tasks = [_task(out, s) if s.get("status") == "ok" and s.get("rows") else s for s in demo["tasks"]]
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    flag = " --update-readme" if readme is not None else ""
    demo = {**demo, "tasks": tasks, "rerendered": f"`{COMMAND} {out}{flag}` at {when}"}
    write_json_atomic(out / "demo.json", demo)
    write_text_atomic(out / "report.md", render_report(demo))
    if readme is not None:
        replace_block(readme, "demo", readme_block(demo))
    return demo


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    update = "--update-readme" in args
    args = [a for a in args if a != "--update-readme"]
    if len(args) > 1 or any(a.startswith("-") for a in args):
        print(f"usage: {COMMAND} [OUT] [--update-readme] (got {' '.join(args)})", file=sys.stderr)
        return 2
    out = Path(args[0] if args else "benchmarks/results/demo")
    try:
        rerender(out, readme=Path("README.md") if update else None)
    except (DataError, OSError, KeyError) as exc:
        print(f"{COMMAND}: cannot re-render {out}: {exc}; expected a demo results folder", file=sys.stderr)
        return 2
    print(f"re-rendered {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
