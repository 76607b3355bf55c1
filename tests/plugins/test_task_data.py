"""Data loading of the dataset tasks: lazy, shared between task objects, clear errors when missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optima_env import DataError, TaskContractError, make_task
from tests.helpers import GSM8K_ROWS, REPO_ROOT, write_jsonl


def test_building_a_task_reads_nothing_and_missing_data_is_reported_on_first_use(tmp_path: Path) -> None:
    task = make_task("cbt", data_dir=tmp_path, source="local")  # no cbt/ folder: still fine
    with pytest.raises(
        DataError, match=r"cannot load cbt: local data: no test.jsonl .* To fix: set --data-dir"
    ):
        task.samples("test")
    with pytest.raises(DataError, match="2WikiMultihopQA has no Hugging Face hub copy"):
        make_task("2wikimultihopqa", data_dir=tmp_path).samples("test")


def test_limit_and_loaded_splits_are_shared_until_a_file_changes(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gsm8k" / "test.jsonl", GSM8K_ROWS)
    first = make_task("gsm8k", data_dir=tmp_path).samples("test")
    assert make_task("gsm8k", data_dir=tmp_path).samples("test") is first  # shared, not re-read
    assert len(make_task("gsm8k", data_dir=tmp_path, limit=1).samples("test")) == 1
    rows = [*GSM8K_ROWS, {"question": "1+1?", "answer": "#### 2"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse clocks
    again = make_task("gsm8k", data_dir=tmp_path).samples("test")
    assert len(again) == 3 and again[2].answers == ("2",)


def test_bad_task_arguments_raise_clear_errors() -> None:
    with pytest.raises(TaskContractError, match="source must be one of"):
        make_task("gsm8k", source="web")
    with pytest.raises(TaskContractError, match="limit must be a positive int"):
        make_task("gsm8k", limit=0)
    with pytest.raises(TaskContractError, match="num_agents"):
        make_task("hotpotqa", num_agents=1)
    with pytest.raises(TaskContractError, match="math_timeout"):
        make_task("math", math_timeout=0)


def test_benchmark_run_reports_a_task_without_data_instead_of_crashing(tmp_path: Path) -> None:
    args = ["--task", "cbt", "--model", "scripted", "--episodes", "2", "--data-dir", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", *args, "--out", str(tmp_path / "run")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    assert "Traceback" not in proc.stderr
    assert "ie/cbt-v0" in proc.stdout and "cannot load cbt" in proc.stdout
