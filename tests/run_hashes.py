"""``python -m tests.run_hashes OUT``: the sha256 of every data file of two tiny fixed-seed runs.

A refactor that must not change behaviour runs this before and after and compares the two
listings (``diff``): one iSFT run and one iDPO run (two iterations each) on a tiny random model
with the embedded tokenizer, CPU, fp32, through the command line. Listed: each stage's JSON lines
files (episodes, scored, selected, pairs, trees, ...) and ``instances.json``; not the files that
hold timings or paths (``result.json``, ``state.json``, ``metrics.jsonl``, ``engine.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from pathlib import Path

SIZES = [
    "generation.instances=3", "generation.num_samples=2", "generation.max_turns=3",
    "generation.max_new_tokens=8", "sft.max_steps=1", "dpo.max_steps=1", "selection.theta=-100.0",
    "tree.normalizer_instances=2", "tree.instances=2", "tree.selections=2", "tree.rollouts=2",
    "tree.theta_filter=-100.0", "tree.theta_diff=0.0",
]  # fmt: skip
SKIPPED = {"result.json", "state.json", "metrics.jsonl", "engine.json", "config.json", "timings.json"}


def hashes(run: Path) -> list[tuple[str, str]]:
    """``(relative path, sha256)`` of the run's data files (checkpoints left out), sorted by path."""
    out = []
    for path in sorted(run.rglob("*")):
        relative = path.relative_to(run)
        if not path.is_file() or path.name in SKIPPED or any("checkpoint" in part for part in relative.parts):
            continue
        if path.suffix in (".jsonl", ".json"):
            out.append((str(relative), hashlib.sha256(path.read_bytes()).hexdigest()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.run_hashes", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a new folder for the model and the two runs")
    args = parser.parse_args(argv)
    from tests.tiny_model import make_tiny_model

    model = make_tiny_model(args.out / "tiny")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    lines = []
    for trainer in ("isft", "idpo"):
        run = args.out / trainer
        sets = [arg for s in SIZES for arg in ("--set", s)]
        subprocess.run(
            [sys.executable, "-m", "optima_trainers.train", "--task", "ie/synth-v0", "--trainer", trainer,
             "--model", str(model), "--iterations", "2", "--backend", "hf", "--seed", "0", "--no-progress",
             "--run-dir", str(run), *sets],
            check=True, env=env, capture_output=True,
        )  # fmt: skip
        lines += [f"{digest}  {trainer}/{relative}" for relative, digest in hashes(run)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
