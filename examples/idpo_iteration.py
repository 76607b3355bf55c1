"""One iDPO iteration end to end: token normalizer → MCTS trees → pairs → DPO (RPO, α = 1).

Small CPU settings by default (the embedded model and task, a few trees); every stage is the
library's (:mod:`optima_trainers.tree.search`, :mod:`optima_trainers.dpo.pairs`,
:mod:`optima_trainers.dpo.trainer`).
Writes under ``--out`` (default ``runs/idpo_iteration/<time>/``):

* ``normalizer_episodes.jsonl``: the conversations that set the token normalizer (spec §6.3);
* ``trees.jsonl``: every tree (nodes with values and visits) and ``pairs.jsonl``: the selected pairs;
* ``checkpoint/``: the trained model (LoRA merged, ``COMPLETE`` marker last);
* ``metrics.json``: wall time and peak RSS of each stage, tree and pair counts, the DPO result.

Example::

    python examples/idpo_iteration.py --instances 4 --selections 2 --rollouts 3 --max-turns 4 \\
        --max-new-tokens 32 --theta-filter -1 --theta-diff 0.05
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import resource
import statistics
import sys
import time
from pathlib import Path

from optima_env import EpisodeScorer, RewardConfig, make_task
from optima_env.io import write_episodes, write_json_atomic, write_text_atomic
from optima_env.policy import SamplingParams
from optima_trainers.config.env import EnvSettings
from optima_trainers.config.train import GenerationConfig, TreeSearchConfig
from optima_trainers.config.training import DPOTrainConfig
from optima_trainers.dpo.pairs import select_top_pairs
from optima_trainers.dpo.trainer import train_dpo
from optima_trainers.run.records import write_pairs
from optima_trainers.tree.search import build_trees, estimate_token_normalizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="ie/synth-v0")
    p.add_argument("--model", default="embedded", help="the current model (and, here, the frozen base)")
    p.add_argument("--instances", type=int, default=4, help="trees (one per training instance)")
    p.add_argument("--normalizer-instances", type=int, default=4, help="fresh instances for the normalizer")
    p.add_argument("--percentile", type=float, default=85.0, help="normalizer percentile (iDPO 85)")
    p.add_argument("--selections", type=int, default=2, help="MCTS selections per tree (paper 8)")
    p.add_argument("--rollouts", type=int, default=3, help="rollouts per selection (paper 3)")
    p.add_argument("--max-turns", type=int, default=4, help="conversation / tree depth (paper 10)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per turn (paper 2000)")
    p.add_argument("--lambda-token", type=float, default=0.6)
    p.add_argument("--lambda-loss", type=float, default=1.0)
    p.add_argument("--theta-filter", type=float, default=0.4, help="θ_dpo-filter (paper 0.4)")
    p.add_argument("--theta-diff", type=float, default=0.2, help="θ_dpo-diff (paper 0.2)")
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=5e-6, help="DPO learning rate (paper 5e-7, full fine-tuning)")
    p.add_argument("--max-length", type=int, default=512, help="DPO max tokens per sequence")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from optima_env.backends.hf import TransformersPolicy
    from optima_env.readability import TransformersLMLoss

    out = Path(args.out or f"runs/idpo_iteration/{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    stages: dict[str, dict[str, float]] = {}
    clock = time.perf_counter()

    def stage(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        stages[name] = {"wall_s": round(now - clock, 2), "peak_rss_mb_so_far": round(peak_rss_mb(), 1)}
        clock = now

    task = make_task(args.task)
    policy = TransformersPolicy.from_pretrained(args.model)
    # the current model is the base model in this first iteration: it also scores readability
    readability = TransformersLMLoss(policy.model, policy.tokenizer)
    env_kwargs = {"tokenizer": policy.tokenizer}
    stage("load")

    normalizer, norm_episodes = estimate_token_normalizer(
        task,
        policy,
        range(args.normalizer_instances),
        percentile=args.percentile,
        seed=args.seed,
        sampling=SamplingParams(temperature=0.7, max_new_tokens=args.max_new_tokens, seed=args.seed),
        env_kwargs={**env_kwargs, "max_turns": args.max_turns},
        progress=True,
    )
    write_episodes(out / "normalizer_episodes.jsonl", norm_episodes)
    stage("normalizer")

    search = TreeSearchConfig(
        selections=args.selections,
        rollouts=args.rollouts,
        theta_filter=args.theta_filter,
        theta_diff=args.theta_diff,
    )
    reward = EpisodeScorer(
        # the tree reward derives from the run's (impersonation zeroes the task term, spec §3)
        search.reward_of(RewardConfig(lambda_token=args.lambda_token, lambda_loss=args.lambda_loss)),
        normalizer=normalizer,
        readability=readability,
        cache_turns=True,  # a tree replays its prefix turns: each text is scored once
    )
    first = args.normalizer_instances  # fresh instances: the cursor moves on
    trees = build_trees(
        task,
        policy,
        list(range(first, first + args.instances)),
        reward_fn=reward.score,
        seed=args.seed,
        search=search,
        generation=GenerationConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens),
        env=EnvSettings(tokenizer=policy.tokenizer),
        progress=True,
    )
    write_text_atomic(out / "trees.jsonl", "".join(json.dumps(t.to_dict()) + "\n" for t in trees))
    stage("mcts")

    all_pairs = [t.pairs() for t in trees]
    pairs = select_top_pairs(all_pairs)
    write_pairs(out / "pairs.jsonl", pairs)
    rewards = [t.reward for tree in trees for t in tree.trajectories]
    summary = {
        "args": vars(args),
        "normalizer": normalizer,
        "trees": len(trees),
        "nodes": sum(len(t.nodes) for t in trees),
        "trajectories": len(rewards),
        "mean_reward": statistics.fmean(rewards),
        "mean_task_score": statistics.fmean(t.episode.task_score for tr in trees for t in tr.trajectories),
        "mean_tokens": statistics.fmean(t.episode.num_tokens for tr in trees for t in tr.trajectories),
        "pairs_before_selection": sum(len(p) for p in all_pairs),
        "pairs": len(pairs),
        "stages": stages,
    }
    if not pairs:
        values = sorted(round(n.value, 3) for t in trees for n in t.nodes[1:])
        summary["error"] = (
            f"no pair passed theta_filter={args.theta_filter}, theta_diff={args.theta_diff}; node values "
            f"range from {values[0]} to {values[-1]}: lower the thresholds or grow more trees"
        )
        write_json_atomic(out / "metrics.json", summary)
        print(summary["error"], file=sys.stderr)
        return 2

    del policy, readability, reward
    gc.collect()
    result = train_dpo(
        model_path=args.model,
        pairs=pairs,
        config=DPOTrainConfig.cpu(
            beta=args.beta, rpo_alpha=1.0, learning_rate=args.lr, max_length=args.max_length
        ),
        output_dir=out / "checkpoint",
    )
    stage("dpo")
    summary["dpo"] = result.to_dict()
    summary["total_wall_s"] = round(sum(s["wall_s"] for s in stages.values()), 2)
    summary["peak_rss_mb"] = round(peak_rss_mb(), 1)
    write_json_atomic(out / "metrics.json", summary)
    print(json.dumps({k: v for k, v in summary.items() if k != "args"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
