"""Two training processes under ``accelerate launch`` (gloo DDP on the CPU): an iSFT stage and a
DPO stage of the embedded task on a tiny random model.

Checked: selection happens once (on the main process; each process generates its shard of a
stage's jobs, ``generation/test_data_parallel.py``); every process receives the same selected
episodes and preference pairs and trains on them; only the main process writes in the run folder (the run
files and both checkpoints; the other process only its shard files); a run killed while the main
process writes the DPO checkpoint (the other process waiting at the barrier) resumes under two
processes to the data and weights of an uninterrupted two-process run.

What each process received and wrote is recorded by ``rank_probe_plugin``, a test plugin loaded in
every process through a real ``optima`` entry point (a ``.dist-info`` on ``PYTHONPATH``). The
launch uses the shipped ``configs/accelerate/multi_gpu.yaml`` with ``--num_processes 2``: on a
machine without CUDA the same config runs gloo DDP on the CPU (``accelerate launch --cpu
--num_processes 2`` would start ONE process: accelerate 1.x runs several CPU processes only
through MPI).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from optima_trainers.run.checkpoint import require_complete
from tests.helpers import REPO_ROOT
from tests.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow

CONFIG = REPO_ROOT / "configs" / "accelerate" / "multi_gpu.yaml"
ARGS = [
    "--task", "ie/synth-v0", "--trainer", "idpo", "--profile", "cpu", "--iterations", "1",
    "--instances", "2", "--samples", "2", "--max-turns", "2", "--max-new-tokens", "8",
    "--concurrency", "2", "--max-steps", "1", "--theta-sft", "-100", "--no-progress",
    "--set", "tree.instances=2", "--set", "tree.normalizer_instances=2", "--set", "tree.selections=2",
    "--set", "tree.rollouts=2", "--set", "tree.theta_filter=-100", "--set", "tree.theta_diff=0",
    "--set", "generation.precision=float32",  # two ranks' data equal one process's in fp32 only
]  # fmt: skip
STAGES = ("iter_00", "iter_01")
DATA_FILES = (
    "episodes.jsonl",
    "scored.jsonl",
    "selected.jsonl",
    "normalizer.jsonl",
    "trees.jsonl",
    "pairs.jsonl",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _install_probe(site: Path) -> str:
    dist = site / "optima_rank_probe-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: optima-rank-probe\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[optima]\nrank_probe = tests.optima_trainers.host.rank_probe_plugin\n"
    )
    return os.pathsep.join([str(site), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])


def launch(run_dir: Path, probe: Path, pythonpath: str, *, model: Path | None = None, fault: str = "") -> int:
    """``accelerate launch`` two processes of the trainer; returns the launcher's exit status."""
    probe.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": pythonpath,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OPTIMA_PROBE_DIR": str(probe),
        "OPTIMA_PROBE_WATCH": str(run_dir),
        "OPTIMA_STRICT_PLUGINS": "1",  # the probe must load, or the test checks nothing
    }
    env.pop("OPTIMA_FAULT", None)
    if fault:
        env["OPTIMA_FAULT"] = fault
    args = (
        ["--resume", "--run-dir", str(run_dir)]
        if model is None
        else [*ARGS, "--model", str(model), "--run-dir", str(run_dir)]
    )
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG),
         "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
         "--main_process_port", str(_free_port()), "-m", "optima_trainers.train", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    if fault:
        assert done.returncode != 0, "the fault point was never reached"
        assert "exitcode: -9" in done.stderr, done.stderr[-3000:]  # the launcher saw the SIGKILL
    elif done.returncode != 0:
        raise AssertionError(f"accelerate launch exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.returncode


def probe_records(probe: Path, rank: int, event: str) -> list[dict]:
    path = probe / f"rank{rank}.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [r for r in records if r["event"] == event]


def foreign_writes(probe: Path, run: Path) -> list[dict]:
    """What the second process wrote in the run folder, aside from the stage folders it may create
    and its own shard files of the stages' generation (``episodes.rank1of2.jsonl``, ...)."""

    def exempt(path: str) -> bool:
        return path in (str(run / s) for s in STAGES) or (
            Path(path).parent in (run / s for s in STAGES) and ".rank1of2." in Path(path).name
        )

    return [r for r in probe_records(probe, 1, "write") if not all(exempt(p) for p in r["paths"])]


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def check_deliveries(probe: Path, run: Path, stages: tuple[str, ...]) -> None:
    """Both processes received each stage's data, identical, and as the main process wrote it."""
    for stage in stages:
        got = [[r for r in probe_records(probe, rank, "delivered") if r["stage"] == stage] for rank in (0, 1)]
        assert all(len(g) == 1 for g in got), got  # once per process
        (zero,), (one,) = got
        assert zero["world_size"] == one["world_size"] == 2 and zero["pid"] != one["pid"]
        assert (zero["sha256"], zero["selected"], zero["pairs"]) == (
            one["sha256"],
            one["selected"],
            one["pairs"],
        )
        kept = "selected.jsonl" if stage == "iter_00" else "pairs.jsonl"
        assert zero["selected" if stage == "iter_00" else "pairs"] == len(lines(run / stage / kept)) > 0


def test_two_processes_train_on_the_same_data_and_resume_after_a_kill(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    model = make_tiny_model(tmp_path / "tiny")
    pythonpath = _install_probe(tmp_path / "site")
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"

    # 1. an uninterrupted two-process run: iSFT initialization, then tree search + DPO
    assert launch(clean, tmp_path / "probe-clean", pythonpath, model=model) == 0
    check_deliveries(tmp_path / "probe-clean", clean, STAGES)
    assert foreign_writes(tmp_path / "probe-clean", clean) == []  # the second process wrote nothing
    written = {p for r in probe_records(tmp_path / "probe-clean", 0, "write") for p in r["paths"]}
    for name in ("config.json", "state.json", "metrics.jsonl", *(f"{s}/result.json" for s in STAGES)):
        assert any(p.startswith(str(clean / name)) for p in written), name  # (atomic writes: name.tmp*)
    for stage in STAGES:
        assert str(clean / stage / ".checkpoint.tmp-write") in written
        require_complete(clean / stage / "checkpoint")  # its manifest matches its files
        assert not (clean / stage / ".checkpoint.tmp-write").exists()
    assert (clean / "iter_01" / "checkpoint" / "dpo_log.json").is_file()

    # 2. killed while the main process writes the DPO checkpoint (the other one at the barrier)
    launch(crashed, tmp_path / "probe-crashed", pythonpath, model=model, fault="checkpoint:2")
    partial = crashed / "iter_01" / ".checkpoint.tmp-write"
    assert (crashed / "iter_00" / "checkpoint" / "COMPLETE").is_file()
    assert (partial / "model.safetensors").is_file() and not (partial / "COMPLETE").exists()
    assert (
        not (crashed / "iter_01" / "checkpoint").exists()
        and not (crashed / "iter_01" / "result.json").exists()
    )

    # 3. resumed under two processes: the DPO stage is retrained from the pairs on disk
    assert launch(crashed, tmp_path / "probe-resumed", pythonpath) == 0
    check_deliveries(tmp_path / "probe-resumed", crashed, ("iter_01",))
    assert foreign_writes(tmp_path / "probe-resumed", crashed) == []
    assert not partial.exists() and require_complete(crashed / "iter_01" / "checkpoint").steps == 1
    for stage in STAGES:
        for name in DATA_FILES:
            if (clean / stage / name).exists():
                assert lines(crashed / stage / name) == lines(clean / stage / name), (stage, name)
    import torch

    for stage in STAGES:
        resumed, uninterrupted = (
            weights(crashed / stage / "checkpoint"),
            weights(clean / stage / "checkpoint"),
        )
        assert resumed.keys() == uninterrupted.keys()
        assert all(torch.allclose(resumed[k], uninterrupted[k], atol=1e-6) for k in resumed), stage
    assert not all(torch.equal(uninterrupted[k], weights(model)[k]) for k in uninterrupted)  # it trained
    assert [json.loads(m)["stage"] for m in lines(crashed / "metrics.jsonl")] == list(STAGES)
