"""``python -m benchmarks.run --suite loop``: one training iteration per phase, per generation engine.

On the embedded task at the ``cpu`` profile, side by side in one run:

* one iSFT iteration (``isft``, stage ``iter_00``: generate, readability + reward, select, train)
  and one iDPO iteration (``idpo``, stage ``iter_01`` after its SFT initialization: token
  normalizer, tree search with its readability scoring, pairs, train), each with today's
  transformers engine (``hf``: ``generation.backend=hf``, precision ``auto``, the ``cdf`` sampler,
  ``readability_scorer=transformers``) and the engine before it (``hf_old``: fp32, the
  ``multinomial`` sampler), timed against each other;
* the SFT phase of the transformers iSFT run against TRL's ``SFTTrainer`` alone on the same
  examples with the same arguments (what the trainer adds: building the masked examples, merging
  the LoRA adapter, the atomic checkpoint with its sha256 manifest).

The runs live in ``<out>/<backend>/<trainer>/`` and resume like any training run: a rerun with the
same ``--out`` reuses every finished stage, and the report adds up the phase times the runs
recorded (compute, not the last invocation's wall time). Writes ``results.json``, ``results.md``
and ``loop.png``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optima_env.io import read_episodes, write_json_atomic, write_text_atomic

__all__ = ["run_loop_suite"]

BACKENDS = {
    "hf_old": {
        "generation.backend": "hf",
        "readability_scorer": "transformers",
        "generation.precision": "float32",
        "generation.sampler": "multinomial",
    },
    "hf": {"generation.backend": "hf", "readability_scorer": "transformers"},
}
STAGES = {"isft": "iter_00", "idpo": "iter_01"}
LABELS = {
    "hf_old": "transformers, the engine before (fp32, multinomial) + transformers readability",
    "hf": "transformers (fast path, precision auto, cdf sampler) + transformers readability",
}


def _train(
    folder: Path, trainer: str, backend: str, *, model: str, seed: int, sizes: Mapping[str, Any]
) -> dict[str, dict[str, float]]:
    from optima_trainers import IterativeTrainer, RunDir, resolve_config

    config = resolve_config(
        "ie/synth-v0",
        trainer,
        profile="cpu",
        model=model,
        seed=seed,
        iterations=1,
        overrides={**BACKENDS[backend], **sizes},
    )
    if (folder / "config.json").is_file():
        run, stored = RunDir.open(folder)
        if stored != config:
            raise ValueError(f"{folder} holds another run's configuration; use another --out")
    else:
        run = RunDir.create(config, run_dir=folder)
    IterativeTrainer(config, run_dir=run, progress=False).run()
    return {stage: run.timings(stage) for stage in run.state().get("timings", {})}


def _sft_alone(run: Path, *, model: str, seed: int) -> float:
    """Seconds of TRL's SFTTrainer alone on the iSFT stage's examples, with the trainer's arguments."""
    import math

    import datasets
    import torch
    import transformers
    import trl

    from optima_env.models import resolve_model_path
    from optima_trainers.config.train import TrainConfig
    from optima_trainers.run.trl import lora_config
    from optima_trainers.sft.data import build_sft_examples

    config = TrainConfig.from_dict(json.loads((run / "config.json").read_text(encoding="utf-8")))
    path = resolve_model_path(model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    examples, _ = build_sft_examples(
        read_episodes(run / "iter_00" / "selected.jsonl"),
        tokenizer,
        max_length=config.sft.max_length,
        seed=seed,
    )
    sft = config.sft
    started = time.perf_counter()
    per_device = max(1, min(sft.per_device_batch_size, sft.batch_size))
    args = trl.SFTConfig(
        output_dir=str(run / "sft_alone"), per_device_train_batch_size=per_device,
        gradient_accumulation_steps=max(1, math.ceil(sft.batch_size / per_device)),
        num_train_epochs=sft.epochs,
        learning_rate=sft.learning_rate, lr_scheduler_type="cosine", warmup_steps=sft.warmup_ratio,
        max_length=sft.max_length, bf16=False, gradient_checkpointing=False, use_cpu=True, seed=seed,
        report_to="none", save_strategy="no", logging_steps=1, dataloader_num_workers=0,
    )  # fmt: skip
    dataset = datasets.Dataset.from_dict(
        {
            "input_ids": [list(e.input_ids) for e in examples],
            "assistant_masks": [list(e.assistant_masks) for e in examples],
        }
    )
    trl.SFTTrainer(
        model=transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(sft.lora_r, sft.lora_alpha, sft.lora_dropout) if sft.lora else None,
    ).train()
    return time.perf_counter() - started


def _table(rows: list[dict[str, Any]], sft: dict[str, float], speedups: dict[str, float]) -> str:
    phases = sorted(
        {p for r in rows for p in r["phases"]},
        key=["generate", "score", "select", "normalizer", "mcts", "train"].index,
    )
    head = "| trainer | stage | engine | " + " | ".join(f"{p} s" for p in phases) + " | total s |"
    lines = [head, "|" + "---|" * (4 + len(phases))]
    for r in rows:
        cells = " | ".join(f"{r['phases'].get(p, 0.0):.1f}" for p in phases)
        lines.append(
            f"| {r['trainer']} | {r['stage']} | {LABELS[r['backend']]} | {cells} | {r['total_s']:.1f} |"
        )
    if speedups:
        lines += ["", "| speedup (the engine before / today's transformers engine, time, same run) | value |"]
        lines += ["|---|---|"] + [f"| {k} | {v:.2f}x |" for k, v in speedups.items()]
    if sft:
        lines += [
            "",
            "SFT phase of the iSFT iteration (transformers run): "
            f"{sft['trainer_train_s']:.1f} s in the trainer, "
            f"{sft['sft_alone_s']:.1f} s for TRL's SFTTrainer alone on the same {sft['examples']} examples "
            f"(trainer / alone = {sft['ratio']:.3f}).",
        ]
    return "\n".join(lines) + "\n"


def run_loop_suite(
    out_dir: str | Path,
    *,
    model: str = "embedded",
    seed: int = 0,
    backends: tuple[str, ...] = tuple(BACKENDS),
    sizes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the suite into ``out_dir`` with ``backends`` (of :data:`BACKENDS`; ``hf``
    among them); returns the results dict (also ``results.json``). ``sizes`` (dotted training
    fields) shrinks the iteration for a test; the benchmark runs the cpu profile's."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows = []
    for backend in backends:
        for trainer, stage in STAGES.items():
            folder = out / backend / trainer
            timings = _train(folder, trainer, backend, model=model, seed=seed, sizes=sizes or {})
            for name, phases in timings.items():
                rows.append(
                    {"backend": backend, "trainer": trainer, "stage": name, "phases": phases,
                     "total_s": sum(phases.values()), "measured": name == stage}
                )  # fmt: skip
    measured = {(r["backend"], r["trainer"]): r for r in rows if r["measured"]}
    speedups = _ratios(measured, "hf_old", "hf") if "hf_old" in backends else {}
    sft_path = out / "sft_alone.json"
    if not sft_path.is_file():
        hf_isft = out / "hf" / "isft"
        alone = _sft_alone(hf_isft, model=model, seed=seed)
        examples = sum(1 for _ in read_episodes(hf_isft / "iter_00" / "selected.jsonl")) * 2
        write_json_atomic(sft_path, {"sft_alone_s": alone, "examples": examples})
    sft = json.loads(sft_path.read_text(encoding="utf-8"))
    sft["trainer_train_s"] = measured[("hf", "isft")]["phases"]["train"]
    sft["ratio"] = sft["trainer_train_s"] / sft["sft_alone_s"]
    results = {
        "suite": "loop",
        "task": "ie/synth-v0",
        "profile": "cpu",
        "model": model,
        "rows": rows,
        "speedups": speedups,
        "sft": sft,
        "compute_s": sum(r["total_s"] for r in rows) + sft["sft_alone_s"],
        "wall_time_s_this_invocation": time.time() - started,
    }
    write_json_atomic(out / "results.json", results)
    table = _table(rows, sft, speedups)
    header = (
        "Training loop per phase: ie/synth-v0, cpu profile, one iteration each, the engines side by side "
        f"in one run. Compute accounted: {results['compute_s'] / 60:.1f} min "
        "(phase times summed over resumes).\n\n"
    )
    write_text_atomic(out / "results.md", header + table)
    _plot(out / "loop.png", measured)
    print(header + table)
    return results


def _ratios(measured: dict[tuple[str, str], dict[str, Any]], a: str, b: str) -> dict[str, float]:
    """Time of engine ``a`` over engine ``b``: each iteration end to end, and its generation phases."""
    ratios = {
        f"one {trainer} iteration ({stage}), end to end": measured[(a, trainer)]["total_s"]
        / measured[(b, trainer)]["total_s"]
        for trainer, stage in STAGES.items()
    }
    for phase in ("generate", "score", "mcts", "normalizer"):
        for trainer in STAGES:
            x, y = measured[(a, trainer)]["phases"].get(phase), measured[(b, trainer)]["phases"].get(phase)
            if x and y:
                ratios[f"{trainer} {phase} phase"] = x / y
    return ratios


def _plot(path: Path, measured: dict[tuple[str, str], dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels, bottoms = [], []
    for i, ((backend, trainer), row) in enumerate(
        sorted(measured.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    ):
        labels.append(f"{trainer}\n{backend}")
        bottom = 0.0
        for phase, seconds in row["phases"].items():
            ax.bar(i, seconds, bottom=bottom, label=phase if i == 0 or phase not in bottoms else None)
            bottom += seconds
            bottoms.append(phase)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("seconds (one iteration)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
