"""Data-parallel generation (issue 30): under ``accelerate launch`` with two processes (gloo on the
CPU, the transformers engine, a tiny random model) every rank generates its shard of each stage's
jobs (the iSFT initialization's episodes, the tree stage's normalizer conversations and trees), and
the main process gathers them into the stage's files.

Checked against a one-process run of the same command: the stage files are the same (the
appended ``episodes.jsonl`` and ``normalizer.jsonl`` hold the same episodes per job, in job order
once gathered; every other file is equal line by line), both ranks logged their shards, no shard
file is left; a run whose rank 1 is SIGKILLed after its first episode resumes to the same data;
and on rank 1 the first stage's SFT model and trainer are gone when the second stage's data
arrives (:mod:`optima_trainers.memory`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.optima_trainers.test_multiprocess import ARGS, CONFIG, DATA_FILES, STAGES, _free_port, lines
from tests.optima_trainers.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow

APPENDED = ("episodes.jsonl", "normalizer.jsonl")  # one process appends them as episodes end


def _install_probe(site: Path) -> str:
    dist = site / "optima_memory_probe-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: optima-memory-probe\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[optima]\nmemory_probe = tests.optima_trainers.memory_probe_plugin\n"
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


def test_every_rank_generates_its_shard_and_the_data_equals_one_process(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    model = make_tiny_model(tmp_path / "tiny")
    pythonpath = _install_probe(tmp_path / "site")
    one, two, killed = tmp_path / "one", tmp_path / "two", tmp_path / "killed"
    train(one, model=model, processes=1, pythonpath=pythonpath, probe=tmp_path / "probe-one")

    # 1. two processes: each generates its half of every stage, the main process gathers
    done = train(two, model=model, processes=2, pythonpath=pythonpath, probe=tmp_path / "probe-two")
    for rank in (0, 1):
        for what in ("2 of 4 jobs", "1 of 2 normalizer conversations", "1 of 2 chunks of trees"):
            assert f"rank {rank}/2: generating {what}" in done.stderr, (rank, what)
    assert_same_data(two, one)
    probe = [json.loads(line) for line in lines(tmp_path / "probe-two" / "rank1.jsonl")]
    (second,) = [r for r in probe if r["stage"] == "iter_01"]
    assert "sft" in second["tracked"]  # rank 1 trained the first stage's model ...
    assert second["alive"] == []  # ... and released it before generating the second stage

    # 2. rank 1 killed after the first episode of its shard; resumed: nothing lost, nothing twice
    fault = "episode:1@1"
    train(killed, model=model, processes=2, pythonpath=pythonpath, probe=tmp_path / "probe-k", fault=fault)
    shard = killed / "iter_00" / "episodes.rank1of2.jsonl"
    assert len(lines(shard)) == 1 and not (killed / "iter_00" / "scored.jsonl").exists()
    kept = lines(shard)[0]
    done = train(killed, model=None, processes=2, pythonpath=pythonpath, probe=tmp_path / "probe-r")
    assert f"{shard}: reusing 1 finished episodes of 2" in done.stderr
    assert kept in lines(killed / "iter_00" / "episodes.jsonl")
    assert_same_data(killed, one)
