"""Data-parallel generation: under ``accelerate launch`` with two processes (gloo on the
CPU, the transformers engine, a tiny random model) every rank generates its shard of each stage's
jobs (the iSFT initialization's episodes, the tree stage's normalizer conversations and trees), and
the main process gathers them into the stage's files.

Checked against a one-process run of the same command: the stage files are the same (the
appended ``episodes.jsonl`` and ``normalizer.jsonl`` hold the same episodes per job, in job order
once gathered; every other file is equal line by line), both ranks logged their shards, no shard
file is left; a run whose rank 1 is SIGKILLed after its first episode resumes to the same data;
and on rank 1 the first stage's SFT model and trainer are gone when the second stage's data
arrives (:mod:`optima_trainers.run.memory`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optima_trainers.generation.shards import (
    Shard,
    collect,
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
    run_dir: Path, *, model: Path | None, processes: int, pythonpath: str, probe: Path, fault: str = ""
) -> subprocess.CompletedProcess:
    """Run the trainer (``model=None``: ``--resume``) in one process or under ``accelerate launch``."""
    probe.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "OPTIMA_MEMORY_PROBE_DIR": str(probe),
           "OPTIMA_STRICT_PLUGINS": "1"}  # fmt: skip
    for name in ("OPTIMA_FAULT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    if fault:
        env["OPTIMA_FAULT"] = fault
    args = ["--resume"] if model is None else [*ARGS, "--model", str(model)]
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
    assert_same_data(run, one)

    # 3. rank 1 trained the first stage's model, and it was gone before the second stage's data;
    # alive then: only the readability scorer its trees were just rewarded with (dropped before
    # the stage trains)
    probe = [json.loads(line) for line in lines(tmp_path / "probe-r" / "rank1.jsonl")]
    (second,) = [r for r in probe if r["stage"] == "iter_01"]
    assert "sft" in second["tracked"] and second["alive"] == ["scorer"]


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
