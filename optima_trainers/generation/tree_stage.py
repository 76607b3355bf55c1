"""The host's generation for tree stages (iDPO, iSFT-DPO; spec §6, §7), phase by phase.

1. ``normalizer``: one conversation (``generation.temperature``) on each of the next
   ``tree.normalizer_instances`` training instances, appended to ``normalizer.jsonl`` and resumed
   like any rollout; the token normalizer is their ``tree.normalizer_percentile`` plus 1.
2. ``mcts``: one tree per next ``tree.instances`` instance (:func:`optima_trainers.tree.search.build_trees`),
   all grown in ONE search (each tree advances on its own; nothing drains between trees); each
   tree is appended to ``trees.jsonl`` as ONE line (``{"chunk": <its position in the stage>,
   "trees": [<its record>]}``) the moment its last selection is finished, its pair
   records to ``pairs_detail.jsonl`` just before (their ``chunk``: the tree's position). A
   resumed run regrows only the trees it has no line for (a tree is a deterministic function of
   its own seed and instance, so a regrown tree equals the lost one), and once every tree is there
   the file is rewritten in tree order (as a gathered file), so its bytes do not depend on which
   trees finished first.
3. ``pairs``: the top ``tree.pair_fraction`` of each tree's pairs
   (:func:`~optima_trainers.dpo.pairs.select_top_pairs`), written atomically to ``pairs.jsonl``.

:func:`read_tree_stage` reads the stage's data back for the ``optima_generation_end`` hook.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from optima_env.episode_scorer import EpisodeScorer
from optima_env.errors import DataError
from optima_env.io import append_jsonl, read_episodes, read_jsonl, read_text, write_text_atomic
from optima_env.policy import ChatPolicy
from optima_env.rollout import make_jobs
from optima_env.types import Episode
from optima_trainers.config.train import TrainConfig
from optima_trainers.generation.rollouts import GenerationContext, PhaseClock, in_flight, stage_rollout
from optima_trainers.generation.shards import (
    Shard,
    collect,
    discard_shards,
    keyed,
    play_shard,
    read_records,
    shard_files,
    sources,
    write_gathered,
)
from optima_trainers.run.faults import fault_point
from optima_trainers.run.records import PreferencePair, read_pairs, write_pairs
from optima_trainers.run.run_format import old_format_error
from optima_trainers.tree.normalizer import token_normalizer

__all__ = ["generate_tree_stage", "read_tree_stage"]

logger = logging.getLogger(__name__)


def _chunk_record(record: Any) -> tuple[int, list[dict[str, Any]]]:
    for name, type_ in (("chunk", int), ("trees", list)):
        value = record.get(name) if isinstance(record, dict) else None
        if not isinstance(value, type_) or isinstance(value, bool):
            raise DataError(f"field '{name}': expected {type_.__name__}, got {type(value).__name__}")
    return record["chunk"], record["trees"]


def finished_trees(path: Path) -> dict[int, list[dict[str, Any]]]:
    """Tree position -> ``[its record]``, from a trees file, one tree per line (a torn last line is
    dropped from the file, so the next append starts on a clean line)."""
    if not path.is_file():
        return {}
    done = dict(read_jsonl(path, _chunk_record, fix="delete the file to regrow the trees"))
    for number, trees in done.items():
        _check_one_tree(number, trees, path)
    text = read_text(path)
    if text and not text.endswith("\n"):  # an interrupted append: rewrite without the torn line
        lines = (json.dumps({"chunk": c, "trees": t}) + "\n" for c, t in sorted(done.items()))
        write_text_atomic(path, "".join(lines))
    return done


def _check_one_tree(number: int, trees: list[Any], path: Path | str = "a trees file") -> None:
    if len(trees) > 1:
        raise old_format_error(path, f"the line of chunk {number} holds {len(trees)} trees")
    if not trees:
        raise DataError(
            f"{path}: the line of chunk {number} holds no tree; delete the file to regrow the trees"
        )


def generate_tree_stage(
    ctx: GenerationContext, *, normalizer_indices: list[int], tree_positions: list[int]
) -> None:
    """Run (or resume) the normalizer, tree and pair phases of one stage into ``ctx.folder``
    (``normalizer_indices``: cursor positions of the normalizer's conversations; ``tree_positions``:
    one tree each). Under several processes (``ctx.shard``) each rank plays its shard of the
    normalizer's conversations, every rank reads all of them for the normalizer, then grows its
    shard of the trees (scoring them itself: a tree's search needs its rewards); the main process
    gathers the stage's files and writes the pairs, the others return."""
    policy = ctx.load_policy()
    started = time.perf_counter()
    normalizer = _normalizer_phase(ctx, policy, normalizer_indices)
    ctx.phase("normalizer", started, {"normalizer": normalizer or 0.0})
    clock = PhaseClock(ctx, "mcts")  # its time recorded as each tree is saved
    _tree_phase(ctx, policy, normalizer, tree_positions, clock)
    ctx.release(policy)
    clock.finish()


def _normalizer_phase(ctx: GenerationContext, policy: ChatPolicy, indices: list[int]) -> float | None:
    """The constant token normalizer from one fresh conversation per position (``percentile``), or
    ``None`` for the paper's running per-instance max, which plays nothing. Every rank needs every
    conversation's length: under several processes all wait for all."""
    gen, tree_cfg = ctx.config.generation, ctx.config.tree
    if tree_cfg.normalizer == "instance_max":  # the paper's per-instance max needs no fresh conversations
        indices = []
    episodes = stage_rollout(
        ctx,
        "normalizer.jsonl",
        make_jobs(indices, 1, ctx.seed),  # cursor positions: each draw its own job
        sampling=gen.sampling(ctx.task.agents, seed=ctx.seed),
        policy=policy,
        everyone=True,
        what="normalizer conversations",
    )
    if tree_cfg.normalizer != "percentile":
        return None
    return token_normalizer(
        episodes, percentile=tree_cfg.normalizer_percentile, rounding=tree_cfg.normalizer_rounding
    )


def _tree_phase(
    ctx: GenerationContext,
    policy: ChatPolicy,
    normalizer: float | None,
    positions: list[int],
    clock: PhaseClock,
) -> None:
    """Grow the trees in one search, each saved as it completes (one line of ``trees.jsonl``, its
    pair records in ``pairs_detail.jsonl``; a rank's own files under several processes), then
    write the kept pairs (the main process, after gathering every rank's trees)."""
    from optima_trainers.dpo.pairs import select_top_pairs

    config, folder, shard = ctx.config, ctx.folder, ctx.shard
    # the run's one scorer: the tree reward, turn losses cached (a tree replays its prefixes), the
    # constant normalizer or the paper's running per-instance max, the scored event once each
    scorer = EpisodeScorer(
        config.tree_reward,
        readability=ctx.readability(),
        normalizer="running" if normalizer is None else normalizer,
        cache_turns=True,
        on_scored=ctx.on_scored,
    )

    def grow(
        numbers: list[int], trees_path: Path, reused: Mapping[int, Any]
    ) -> dict[int, list[dict[str, Any]]]:
        done = finished_trees(trees_path)
        _prune_details(_details_of(trees_path), set(done))  # a tree's records whose line never came
        todo = [n for n in numbers if n not in done and n not in reused]
        if todo:
            jobs = [(n, positions[n]) for n in todo]
            _grow_trees(ctx, policy, scorer, jobs, trees_path, done, clock)
        return done

    numbers = list(range(len(positions)))
    if shard.world == 1:
        _fold_trees(folder, numbers)
        done = grow(numbers, folder / "trees.jsonl", {})
        _order_trees(folder)
    else:
        play_shard(shard, folder, "trees.jsonl", numbers, lambda ps, path, reused: grow(ps, path, reused),
                   key_of=_chunk_key, what="trees")  # fmt: skip
        if not shard.main:
            return
        done = _gather_trees(shard, folder, numbers)
    trees_done = [t for number in sorted(done) for t in done[number]]
    per_tree = [[PreferencePair.from_dict(p) for p in t["pairs"]] for t in trees_done]
    write_pairs(folder / "pairs.jsonl", select_top_pairs(per_tree, config.tree.pair_fraction))


def _grow_trees(
    ctx: GenerationContext,
    policy: ChatPolicy,
    scorer: EpisodeScorer,
    todo: list[tuple[int, int]],
    trees_path: Path,
    done: dict[int, list[dict[str, Any]]],
    clock: PhaseClock,
) -> None:
    """Grow the trees ``todo`` (``(number, cursor position)`` each) in one search; append each
    tree's pair records to the file beside ``trees_path``, then its line to ``trees_path``, as
    soon as it completes (and record it in ``done``, and the time that grew it on ``clock``)."""
    from optima_trainers.dpo.pairs import append_pair_details, pair_details
    from optima_trainers.tree.search import build_trees

    config = ctx.config
    details_path = _details_of(trees_path)

    def save(i: int, tree: Any) -> None:
        number = todo[i][0]
        details = pair_details(
            [tree], chunk=number, fraction=config.tree.pair_fraction,
            train_capped_turns=config.sft.train_capped_turns,  # one home: SFT's and the pairs' capped turns
        )  # fmt: skip
        append_pair_details(details_path, details)
        done[number] = [_tree_record(tree, config)]
        append_jsonl(trees_path, [{"chunk": number, "trees": done[number]}])
        clock.lap()
        fault_point("mcts_tree")

    build_trees(
        ctx.task,
        policy,
        [p % ctx.num_train for _, p in todo],
        reward_fn=scorer.score,
        split=config.split,
        env=ctx.env(policy),
        seed=ctx.seed,
        search=config.tree,
        generation=config.generation,
        keys=[p for _, p in todo],
        concurrency=in_flight(config.generation, policy),
        driver=config.generation.driver,
        on_tree=save,
        progress=ctx.progress,
    )


def _order_trees(folder: Path) -> None:
    """One process: rewrite ``trees.jsonl`` (and ``pairs_detail.jsonl``) in tree order once every
    tree is there, when they were appended in another order (nothing when already in order)."""
    path = folder / "trees.jsonl"
    records = read_records(path)
    ordered = sorted(records, key=_chunk_key)
    if ordered != records:
        _write_trees(folder, [(path, r) for r in ordered])


def _details_of(trees_path: Path) -> Path:
    """The pair records' file beside a trees file (``trees.rank1of2.jsonl`` ->
    ``pairs_detail.rank1of2.jsonl``)."""
    from optima_trainers.dpo.pairs import PAIR_DETAILS

    return trees_path.with_name(trees_path.name.replace("trees", PAIR_DETAILS.partition(".")[0], 1))


def _prune_details(path: Path, chunks: set[int]) -> None:
    from optima_trainers.dpo.pairs import prune_pair_details

    prune_pair_details(path, chunks)


def _chunk_key(record: dict[str, Any]) -> int:
    number, trees = _chunk_record(record)
    _check_one_tree(number, trees)
    return number


def _write_trees(folder: Path, gathered: list[tuple[Path, dict[str, Any]]]) -> None:
    """Write ``pairs_detail.jsonl`` then ``trees.jsonl`` (main process) from gathered tree records,
    each tree's pair records from the file beside the trees file it came from."""
    from optima_trainers.dpo.pairs import PAIR_DETAILS

    by_source: dict[Path, dict[int, list[dict[str, Any]]]] = {}
    details: list[dict[str, Any]] = []
    for source, record in gathered:
        path = _details_of(source)
        if path not in by_source:
            by_source[path] = {}
            for detail in read_records(path):
                by_source[path].setdefault(detail.get("chunk"), []).append(detail)
        details += by_source[path].get(record["chunk"], [])
    write_gathered(folder, PAIR_DETAILS, details)  # first: a chunk's records before its trees line
    write_gathered(folder, "trees.jsonl", [record for _, record in gathered])


def _fold_trees(folder: Path, numbers: list[int]) -> None:
    """One process resuming a tree stage that several began: merge their trees into the stage's
    files and remove the shard files."""
    from optima_trainers.dpo.pairs import PAIR_DETAILS

    if not shard_files(folder, "trees.jsonl") and not shard_files(folder, PAIR_DETAILS):
        return
    found = keyed(sources(folder, "trees.jsonl"), _chunk_key)
    _write_trees(folder, [found[n] for n in numbers if n in found])
    discard_shards(folder, "trees.jsonl", PAIR_DETAILS)


def _gather_trees(shard: Shard, folder: Path, numbers: list[int]) -> dict[int, list[dict[str, Any]]]:
    """The main process: every rank's trees, once all are done, written to the stage's files."""
    from optima_trainers.dpo.pairs import PAIR_DETAILS

    gathered = collect(shard, folder, "trees.jsonl", numbers, key_of=_chunk_key)
    _write_trees(folder, gathered)
    discard_shards(folder, "trees.jsonl", PAIR_DETAILS, "normalizer.jsonl")
    return {record["chunk"]: record["trees"] for _, record in gathered}


def _tree_record(tree: Any, config: TrainConfig) -> dict[str, Any]:
    """A tree's line in ``trees.jsonl``: its trajectories, summary and kept pairs (with the chosen
    side's task credit only where ``dpo.rpo_scope="credited"`` needs it)."""
    episodes = [t.episode for t in tree.trajectories]
    candidates = tree.pair_candidates(train_capped_turns=config.sft.train_capped_turns)
    credited = config.dpo.rpo_scope == "credited"
    return {
        "index": tree.index,
        "sample_id": tree.sample_id,
        "nodes": len(tree.nodes),
        "trajectories": [e.to_dict() for e in episodes],
        "mean_reward": sum(t.reward for t in tree.trajectories) / max(1, len(episodes)),
        "mean_task_score": sum(e.task_score for e in episodes) / max(1, len(episodes)),
        "mean_tokens": sum(e.num_tokens for e in episodes) / max(1, len(episodes)),
        "pairs": [
            (replace(c.pair, chosen_task=c.chosen.task) if credited else c.pair).to_dict()
            for c in candidates
            if c.kept
        ],
    }


def read_tree_stage(
    folder: Path, config: TrainConfig
) -> tuple[list[Episode], list[PreferencePair], dict[str, float]]:
    """``(trajectories, kept pairs, metrics)`` of a generated tree stage (the metrics with the
    pairs' summary, :func:`~optima_trainers.dpo.pairs.pair_summary`)."""
    from optima_trainers.dpo.pairs import PAIR_DETAILS, pair_summary, read_pair_details

    trees = [t for _, line in sorted(finished_trees(folder / "trees.jsonl").items()) for t in line]
    episodes = [Episode.from_dict(e) for t in trees for e in t.get("trajectories", [])]
    pairs = read_pairs(folder / "pairs.jsonl")
    fresh = read_episodes(folder / "normalizer.jsonl")
    n = max(1, len(trees))
    metrics = {
        "mcts/normalizer": token_normalizer(
            fresh, percentile=config.tree.normalizer_percentile, rounding=config.tree.normalizer_rounding
        )
        if fresh
        else 0.0,
        "mcts/trees": float(len(trees)),
        "mcts/nodes": sum(t["nodes"] for t in trees) / n,
        "reward/total": sum(t["mean_reward"] for t in trees) / n,
        "rollout/task_score": sum(t["mean_task_score"] for t in trees) / n,
        "rollout/tokens": sum(t["mean_tokens"] for t in trees) / n,
        "mcts/pairs_found": float(sum(len(t["pairs"]) for t in trees)),
        "mcts/pairs": float(len(pairs)),
    }
    if (folder / PAIR_DETAILS).is_file():  # absent when the stage grew no tree
        metrics |= pair_summary(read_pair_details(folder / PAIR_DETAILS))
    return episodes, pairs, metrics
