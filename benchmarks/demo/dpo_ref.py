"""``python -m benchmarks.demo.dpo_ref --out DIR``: one DPO stage with the reference
model's log-probs computed every step (the path before issue 45) and computed once before the
first step (``dpo.precompute_ref_log_probs``), side by side in one run.

Both paths train the same stage with :func:`~optima_trainers.dpo.trainer.train_dpo`: the first
``--pairs`` preference pairs of a committed tree stage (default: the demo's first iDPO stage on the
synthetic task), the embedded model as the start, and the demo's DPO recipe on the ``cpu`` profile
(:data:`~benchmarks.demo.tasks.MAIN_TASK`'s ``dpo.*`` overrides: LoRA, batch 8, 2 epochs, held-out
pairs evaluated each epoch). They differ in ``dpo.precompute_ref_log_probs`` only. With
``--repeats 2`` the second round runs the paths in the other order (the machine is shared, so a
drift in its load then falls on both).

Per path: the stage's seconds (:func:`train_dpo` from the call to the saved checkpoint: the model
load, the reference pass when it is precomputed, the steps, the evaluations and the save), TRL's
training-loop seconds (``train_runtime``: the steps and the evaluations, not the precomputation,
which runs when the trainer is built), both per optimizer step, and the losses: the final training
loss, the last held-out loss and the largest difference of a logged step's loss from the other
path's. Writes ``results.json``, ``results.md`` and ``command.txt``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from optima_env.io import write_json_atomic, write_text_atomic

__all__ = ["PAIRS", "PATHS", "main", "run_dpo_ref"]

PATHS = {"per_step": False, "precomputed": True}
"""Each path's ``dpo.precompute_ref_log_probs``."""
_REPO = Path(__file__).resolve().parents[2]
PAIRS = _REPO / "benchmarks/results/demo/synth/train/idpo/iter_01/pairs.jsonl"
"""The default pairs: the demo's first iDPO stage on the synthetic task."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.demo.dpo_ref", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default="benchmarks/results/dpo_ref", help="results folder")
    parser.add_argument("--model", default="embedded", help="embedded, a Hugging Face name or folder")
    parser.add_argument("--pairs-file", default=str(PAIRS), help="a stage's pairs.jsonl")
    parser.add_argument("--pairs", type=int, default=12, help="the first N pairs (90%% train)")
    parser.add_argument("--epochs", type=float, default=None, help="dpo.epochs (default: the recipe's)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds; each round runs both paths")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.pairs < 2 or args.repeats < 1:
        parser.error("--pairs must be >= 2 and --repeats >= 1")
    command = " ".join(["python -m benchmarks.demo.dpo_ref", *map(shlex.quote, argv)])
    run_dpo_ref(args.out, model=args.model, pairs_file=args.pairs_file, pairs=args.pairs,
                epochs=args.epochs, repeats=args.repeats, seed=args.seed, command=command)  # fmt: skip
    return 0


def stage_config(*, epochs: float | None = None) -> Any:
    """The demo's DPO stage settings on the ``cpu`` profile (``epochs``: replaced when given)."""
    from benchmarks.demo.tasks import MAIN_TASK
    from optima_trainers.config.train import resolve_config

    overrides = {k: v for k, v in MAIN_TASK.config_overrides("idpo").items() if k.startswith("dpo.")}
    if epochs is not None:
        overrides["dpo.epochs"] = epochs
    return resolve_config(MAIN_TASK.task, "idpo", profile="cpu", device="cpu", overrides=overrides).dpo


def run_dpo_ref(
    out_dir: str | Path,
    *,
    model: str = "embedded",
    pairs_file: str | Path = PAIRS,
    pairs: int = 12,
    epochs: float | None = None,
    repeats: int = 2,
    seed: int = 0,
    command: str = "",
) -> dict[str, Any]:
    """Train the stage both ways ``repeats`` times; write ``results.json``, ``results.md`` and
    ``command.txt`` into ``out_dir``."""
    import torch

    from optima_trainers.dpo.trainer import train_dpo
    from optima_trainers.run.records import read_pairs

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    chosen = read_pairs(pairs_file)[:pairs]
    base = stage_config(epochs=epochs)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="optima-dpo-ref-") as tmp:
        for round_ in range(repeats):
            order = list(PATHS) if round_ % 2 == 0 else list(reversed(PATHS))
            for path in order:
                config = dataclasses.replace(base, precompute_ref_log_probs=PATHS[path])
                folder = Path(tmp) / f"{round_}-{path}"
                result = train_dpo(model_path=model, pairs=chosen, config=config, output_dir=folder / "out",
                                   trainer_dir=folder / "trainer", seed=seed)  # fmt: skip
                runs.append(_row(path, round_, result))
                print(f"dpo_ref {path} (round {round_ + 1}): {runs[-1]['stage_s']:.1f} s", flush=True)
    paths = {path: _summary([r for r in runs if r["path"] == path]) for path in PATHS}
    first = {path: next(r for r in runs if r["path"] == path) for path in PATHS}
    losses = [first[p]["losses"] for p in PATHS]
    results = {
        "suite": "dpo_ref", "model": model, "pairs_file": str(pairs_file), "pairs": len(chosen),
        "config": dataclasses.asdict(base) | {"precompute_ref_log_probs": "per path"}, "seed": seed,
        "repeats": repeats, "paths": paths, "runs": runs,
        "max_step_loss_diff": max(abs(a - b) for a, b in zip(*losses, strict=True)),
        "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(), "wall_time_s": time.time() - started, "command": command,
    }  # fmt: skip
    write_json_atomic(out / "results.json", results)
    write_text_atomic(out / "results.md", report(results))
    write_text_atomic(out / "command.txt", command + "\n")
    print(report(results))
    return results


def _row(path: str, round_: int, result: Any) -> dict[str, Any]:
    steps = [h for h in result.history if "loss" in h]
    evals = [h for h in result.history if "eval_loss" in h]
    return {
        "path": path,
        "round": round_,
        "steps": result.steps,
        "train_pairs": result.num_examples,
        "stage_s": result.metrics["wall_time_s"],
        "train_loop_s": result.metrics["train_runtime"],
        "train_loss": result.train_loss,
        "eval_loss": evals[-1]["eval_loss"] if evals else None,
        "losses": [h["loss"] for h in steps],
    }


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(key: str) -> float:
        return sum(r[key] for r in rows) / len(rows)

    steps = rows[0]["steps"]
    return {
        "stage_s": mean("stage_s"),
        "stage_s_per_step": mean("stage_s") / steps,
        "train_loop_s": mean("train_loop_s"),
        "train_loop_s_per_step": mean("train_loop_s") / steps,
        "steps": steps,
        "train_pairs": rows[0]["train_pairs"],
        "train_loss": rows[0]["train_loss"],
        "eval_loss": rows[0]["eval_loss"],
    }


def _shown(path: str) -> str:
    full = Path(path).resolve()
    return str(full.relative_to(_REPO)) if full.is_relative_to(_REPO) else path


def report(results: dict[str, Any]) -> str:
    """The Markdown table of ``results``."""
    config, paths = results["config"], results["paths"]
    lines = [
        f"One DPO stage, reference log-probs every step vs computed once before the first step "
        f"(`dpo.precompute_ref_log_probs`), model `{results['model']}` (fp32, LoRA r={config['lora_r']}), "
        f"the first {results['pairs']} pairs of `{_shown(results['pairs_file'])}`"
        f" ({paths['per_step']['train_pairs']} train, the rest held out), batch {config['batch_size']} "
        f"({config['per_device_batch_size']} a pass), {config['epochs']:g} epochs, evaluation each epoch: "
        f"{paths['per_step']['steps']} steps; mean of {results['repeats']} round(s), torch "
        f"{results['torch_threads']} threads on {results['cpu_count']} cores (shared machine; load "
        f"average at the end {results['load_average'][0]:.1f}).",
        "",
        "| path | stage s | stage s/step | training loop s | loop s/step | final train loss "
        "| last eval loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in paths.items():
        lines.append(
            f"| {name} | {row['stage_s']:.1f} | {row['stage_s_per_step']:.2f} | {row['train_loop_s']:.1f} | "
            f"{row['train_loop_s_per_step']:.2f} | {row['train_loss']:.6f} | "
            + (f"{row['eval_loss']:.6f} |" if row["eval_loss"] is not None else "- |")
        )
    per_step, once = paths["per_step"], paths["precomputed"]
    lines += [
        "",
        f"Stage time precomputed / per step: {once['stage_s'] / per_step['stage_s']:.3f}; largest "
        f"difference of a logged step's loss: {results['max_step_loss_diff']:.2e}.",
        "",
        f"Command: `{results['command']}` ({results['wall_time_s'] / 60:.1f} min).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
