"""The transformers engine as issue 49 found it, against today's two engines, in one run.

The rollout suite's ``engine_old`` phase stands in for the engine the issue set its 2x target
against: it plays the old settings (fp32 linear layers, per-row ``torch.multinomial``) on today's
code, which has changed since (prefill in chunks, the prefill's LM head, KV handling). This script
checks that stand-in on the fixed-length workload (the rollout suite's defaults, which the issue's
figures were measured on): the ``engine`` phase of the commit the issue was filed at
(:data:`FILED_AT`), run from a git worktree of it with its own code and plugins, then today's
``engine_old`` and ``engine``, one after the other in one process tree. Each run starts afresh:
``out_dir``'s ``filed/`` and ``today/`` are replaced.

python -m benchmarks.throughput.as_filed --out benchmarks/results/as_filed

Needs the repository's git history (a clone, not an export) and this environment's packages
(the filed commit runs on them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from optima_env.cli_support import Parser, add_common_flags, run_command, setup_logging
from optima_env.errors import RunConfigError
from optima_env.io import write_json_atomic, write_text_atomic

__all__ = ["FILED_AT", "main", "table"]

FILED_AT = "969bb99854417b41b0742e16f2616f359f92dd99"
"""The commit issue 49 was filed at (its engine measured 69.4 tok/s then, in its ``rollout`` results)."""

_ROWS = (
    ("filed", "engine", "as filed"),
    ("today", "engine_old", "engine_old"),
    ("today", "engine", "engine"),
)
"""(folder, phase, row label) of the three runs, in the order they run."""


def table(rows: dict[str, float]) -> str:
    """The results table: tokens/s per row and the new engine's ratio to each of the other two.

    >>> print(table({"as filed": 100.0, "engine_old": 100.5, "engine": 169.4}))
    | engine | tokens/s | engine / this |
    |---|---|---|
    | as filed | 100.0 | 1.69x |
    | engine_old | 100.5 | 1.69x |
    | engine | 169.4 | 1.00x |
    """
    lines = ["| engine | tokens/s | engine / this |", "|---|---|---|"]
    lines += [f"| {label} | {rate:.1f} | {rows['engine'] / rate:.2f}x |" for label, rate in rows.items()]
    return "\n".join(lines)


def run(out: Path, commit: str) -> dict[str, Any]:
    """Run the three engines (see the module docstring); write ``results.json`` and ``results.md``."""
    repo = Path(__file__).resolve().parents[2]
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=repo, capture_output=True)
    if known.returncode != 0:
        raise RunConfigError(
            f"--commit: expected a commit of this repository's history, got {commit!r}, which {repo} "
            "does not hold; run from a git clone (not an export), after a 'git fetch' if it is shallow"
        )
    given, out = out, out.resolve()  # the runs below start in other folders
    for name in ("filed", "today"):
        shutil.rmtree(out / name, ignore_errors=True)
    bench = [sys.executable, "-m", "benchmarks.throughput.rollout_bench"]
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "filed"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), commit], cwd=repo, check=True)
        try:
            path = os.pathsep.join([str(worktree), str(worktree / "plugins")])  # its code and plugins first
            subprocess.run([*bench, "--out", str(out / "filed"), "--phases", "engine"],
                           cwd=worktree, env=dict(os.environ, PYTHONPATH=path), check=True)  # fmt: skip
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=repo, check=True)
    subprocess.run(
        [*bench, "--out", str(out / "today"), "--phases", "engine_old", "engine"], cwd=repo, check=True
    )
    rows, phases = {}, {}
    for folder, phase, label in _ROWS:
        saved = json.loads((out / folder / f"phase_{phase}.json").read_text())
        rows[label] = saved["result"]["tokens_per_s"]
        phases[label] = saved["result"]
    for folder in ("filed", "today"):  # keep the phases' records, not the suite's pages and plots
        for leftover in (out / folder).iterdir():
            if leftover.is_file() and not leftover.name.startswith("phase_"):
                leftover.unlink()
    results = {"filed_at": commit, "tokens_per_s": rows, "phases": phases}
    write_json_atomic(out / "results.json", results)
    write_text_atomic(
        out / "command.txt", f"python -m benchmarks.throughput.as_filed --out {given} --commit {commit}\n"
    )
    write_text_atomic(
        out / "results.md",
        f"The engine at {commit[:7]} (issue 49 filed) and today's, one run:\n\n{table(rows)}\n",
    )
    return results


def build_parser() -> argparse.ArgumentParser:
    parser = Parser("python -m benchmarks.throughput.as_filed", __doc__)
    parser.add_argument("--out", default="results/as_filed", help="output folder")
    parser.add_argument("--commit", default=FILED_AT, help="the commit whose engine to run")
    add_common_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (:mod:`optima_env.cli_support`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()

    def body() -> None:
        ns = build_parser().parse_args(argv)
        setup_logging(ns)
        print(table(run(Path(ns.out), ns.commit)["tokens_per_s"]))

    return run_command(
        body, argv=argv, on_interrupt="interrupted; rerun the same command (each run starts afresh)"
    )


if __name__ == "__main__":
    sys.exit(main())
