"""The DPO stage of iDPO and iSFT-DPO (spec §6, §7), run by :class:`~optima_trainers.loop.IterativeTrainer`.

Phases, each persisted before the next:

1. ``normalizer``: one conversation (temperature 0.7) on each of the next ``normalizer_instances``
   training instances, appended to ``normalizer.jsonl`` and resumed like any rollout; the token
   normalizer is their ``normalizer_percentile`` (85 iDPO, 80 iSFT-DPO) plus 1.
2. ``mcts``: one tree per next ``mcts_instances`` instance (:func:`optima_trainers.mcts.build_trees`),
   grown in chunks of trees; each finished chunk's pairs are appended as ONE line to
   ``trees.jsonl``, so a resumed run regrows only the chunk it was killed in (a chunk is a
   deterministic function of its trees, so the regrown chunk equals the lost one).
3. ``pairs``: the top ``pair_fraction`` of each tree's pairs
   (:func:`~optima_trainers.pairs.select_top_pairs`), written atomically to ``pairs.jsonl``.
4. ``train``: DPO from the current model, which is also the reference (RPO α = ``rpo_alpha``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optima_env.errors import DataError
from optima_env.io import append_jsonl, read_episodes, read_text
from optima_env.policy import SamplingParams
from optima_env.reward import percentile_normalizer
from optima_env.rollout import make_jobs
from optima_trainers.checkpoint import (
    TrainResult,
    discard_partial,
    is_complete,
    require_complete,
    train_metrics,
)
from optima_trainers.faults import fault_point
from optima_trainers.generation import resumable_rollout
from optima_trainers.types import PreferencePair, read_pairs, write_pairs

if TYPE_CHECKING:
    from optima_trainers.loop import IterativeTrainer, Stage

__all__ = ["run_dpo_stage", "train_dpo_stage"]

logger = logging.getLogger(__name__)


def _chunks(positions: list[int], size: int) -> list[list[int]]:
    return [positions[i : i + size] for i in range(0, len(positions), size)]


def _finished_chunks(path: Path) -> dict[int, list[dict[str, Any]]]:
    """Chunk number -> its trees, from ``trees.jsonl`` (a torn last line is ignored)."""
    if not path.is_file():
        return {}
    done: dict[int, list[dict[str, Any]]] = {}
    lines = read_text(path).split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1:
                continue  # the append was interrupted: that chunk is regrown
            raise DataError(
                f"{path}, line {i + 1}: invalid JSON ({exc}); delete the file to regrow the trees"
            ) from exc
        for name, type_ in (("chunk", int), ("trees", list)):
            value = record.get(name) if isinstance(record, dict) else None
            if not isinstance(value, type_) or isinstance(value, bool):
                raise DataError(
                    f"{path}, line {i + 1}: field '{name}': expected {type_.__name__}, got "
                    f"{type(value).__name__}; delete the file to regrow the trees"
                )
        done[record["chunk"]] = record["trees"]
    good = "".join(json.dumps({"chunk": c, "trees": t}) + "\n" for c, t in sorted(done.items()))
    path.write_text(good, encoding="utf-8")
    return done


def run_dpo_stage(trainer: IterativeTrainer, stage: Stage, model: str, cursor: int) -> dict[str, Any]:
    """Run (or resume) one DPO stage; returns its ``result.json`` record."""
    from optima_trainers.mcts import MCTSConfig, MCTSReward, build_trees
    from optima_trainers.pairs import select_top_pairs

    cfg, run = trainer.config, trainer.run_dir
    folder = run.stage(stage.name)
    from optima_trainers.loop import stage_seed

    seed = stage_seed(cfg.seed, stage.name)
    norm_indices = trainer._indices(cursor, cfg.normalizer_instances)
    tree_start = cursor + cfg.normalizer_instances
    positions = list(range(tree_start, tree_start + cfg.mcts_instances))
    pairs_path, trees_path = folder / "pairs.jsonl", folder / "trees.jsonl"
    if not pairs_path.is_file():
        started = time.perf_counter()
        policy = trainer._policy(model)
        env_kwargs = trainer._env_kwargs(policy)
        episodes = resumable_rollout(
            trainer.task,
            policy,
            jobs=make_jobs(norm_indices, 1, seed),
            path=folder / "normalizer.jsonl",
            sampling=SamplingParams(
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                max_new_tokens=cfg.max_new_tokens,
                seed=seed,
                stop=trainer.stops,
            ),
            env_kwargs=env_kwargs,
            concurrency=cfg.concurrency,
            progress=trainer.progress,
        )
        normalizer = percentile_normalizer([e.num_tokens for e in episodes], cfg.normalizer_percentile)
        trainer._phase(stage, "normalizer", started, normalizer=normalizer)

        started = time.perf_counter()
        reward = MCTSReward(
            normalizer=normalizer,
            config=trainer._reward_config(
                lambda_token=cfg.dpo_lambda_token, lambda_loss=cfg.dpo_lambda_loss, impersonation="mcts"
            ),
            readability=trainer.scorer,
        )
        mcts = MCTSConfig(
            num_selections=cfg.mcts_selections,
            rollouts_per_selection=cfg.mcts_rollouts,
            max_depth=cfg.max_turns,
            temperature=cfg.temperature,
            max_new_tokens=cfg.max_new_tokens,
        )
        mcts_env = {k: v for k, v in env_kwargs.items() if k not in ("split", "max_turns", "diverse_formats")}
        per_chunk = max(1, cfg.concurrency // max(1, cfg.mcts_rollouts))
        done = _finished_chunks(trees_path)
        for number, chunk in enumerate(_chunks(positions, per_chunk)):
            if number in done:
                continue
            trees = build_trees(
                trainer.task,
                policy,
                [p % trainer.num_train for p in chunk],
                reward_fn=reward.score,
                split=cfg.split,
                seed=seed,
                config=mcts,
                env_kwargs=mcts_env,
                keys=chunk,
                progress=trainer.progress,
            )
            record = [_tree_record(t, cfg.theta_filter, cfg.theta_diff) for t in trees]
            append_jsonl(trees_path, [{"chunk": number, "trees": record}])
            done[number] = record
            fault_point("mcts_chunk")
        trainer._release(policy)
        trees = [t for number in sorted(done) for t in done[number]]
        per_tree = [[PreferencePair.from_dict(p) for p in t["pairs"]] for t in trees]
        write_pairs(pairs_path, select_top_pairs(per_tree, cfg.pair_fraction))
        trainer._phase(stage, "mcts", started)
    pairs = read_pairs(pairs_path)
    started = time.perf_counter()
    result = train_dpo_stage(trainer, folder, model, pairs)
    trainer._phase(stage, "train", started)
    counts = [e.num_tokens for e in read_episodes(folder / "normalizer.jsonl")]
    trees = [t for _, chunk in sorted(_finished_chunks(trees_path).items()) for t in chunk]
    metrics = {
        "iteration": float(stage.number),
        "mcts/normalizer": percentile_normalizer(counts, cfg.normalizer_percentile),
        **_mcts_metrics(trees),
        "mcts/pairs": float(len(pairs)),
        **train_metrics(result),
        **{f"time/{k}_s": v for k, v in run.timings(stage.name).items()},
    }
    return {
        "model": result.checkpoint if result else model,
        "cursor_end": tree_start + cfg.mcts_instances,
        "metrics": metrics,
    }


def _tree_record(tree: Any, theta_filter: float, theta_diff: float) -> dict[str, Any]:
    episodes = [t.episode for t in tree.trajectories]
    return {
        "index": tree.index,
        "sample_id": tree.sample_id,
        "nodes": len(tree.nodes),
        "trajectories": len(episodes),
        "mean_reward": sum(t.reward for t in tree.trajectories) / max(1, len(episodes)),
        "mean_task_score": sum(e.task_score for e in episodes) / max(1, len(episodes)),
        "mean_tokens": sum(e.num_tokens for e in episodes) / max(1, len(episodes)),
        "pairs": [p.to_dict() for p in tree.pairs(theta_filter, theta_diff)],
    }


def _mcts_metrics(trees: list[dict[str, Any]]) -> dict[str, float]:
    n = max(1, len(trees))
    return {
        "mcts/trees": float(len(trees)),
        "mcts/nodes": sum(t["nodes"] for t in trees) / n,
        "reward/total": sum(t["mean_reward"] for t in trees) / n,
        "rollout/task_score": sum(t["mean_task_score"] for t in trees) / n,
        "rollout/tokens": sum(t["mean_tokens"] for t in trees) / n,
        "mcts/pairs_found": float(sum(len(t["pairs"]) for t in trees)),
    }


def train_dpo_stage(
    trainer: IterativeTrainer, folder: Path, model: str, pairs: list[PreferencePair]
) -> TrainResult | None:
    """DPO from ``model`` (also the reference) on ``pairs``; ``None`` when there is no pair."""
    from optima_trainers.dpo import DPOTrainConfig, train_dpo

    cfg, checkpoint = trainer.config, folder / "checkpoint"
    if is_complete(checkpoint):
        return require_complete(checkpoint)
    discard_partial(checkpoint)
    if not pairs:
        logger.warning(
            "%s: no preference pair passed the filters; the model carries over unchanged", folder.name
        )
        return None
    return train_dpo(
        model_path=model,
        pairs=pairs,
        config=DPOTrainConfig(
            beta=cfg.dpo_beta,
            rpo_alpha=cfg.rpo_alpha,
            learning_rate=cfg.dpo_lr,
            epochs=cfg.dpo_epochs,
            batch_size=cfg.dpo_batch_size,
            per_device_batch_size=min(cfg.per_device_batch_size, cfg.dpo_batch_size),
            max_length=cfg.dpo_max_length,
            warmup_ratio=cfg.warmup_ratio,
            lora=cfg.lora,
            lora_r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            seed=cfg.seed,
            extra_args={"max_steps": cfg.max_steps} if cfg.max_steps is not None else {},
        ),
        output_dir=checkpoint,
        report_to=cfg.report_to,
        trainer_dir=folder / "trainer",
    )
