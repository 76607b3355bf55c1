"""Episodes whose answer the task cannot read are counted and shown: the CLI table, the report, the
viewer, and a warning when they are more than half of a row.

The model is the embedded model's actual GSM8K turns (a fixture: it writes "The answer is: 540",
never ``\\boxed{}``), replayed by an OpenAI-compatible stub server to the real benchmark CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT
from tests.optima_env.backends.test_openai import StubServer

FIXTURE = Path(__file__).parent / "fixtures" / "embedded_gsm8k_cot.json"
TURNS = json.loads(FIXTURE.read_text())["turns"]


def replay(n: int, body: dict) -> tuple[str, str]:
    """The fixture turn whose question is in the request (the embedded model's own reply)."""
    prompt = "\n".join(str(m.get("content", "")) for m in body["messages"])
    return "ok", next(t["text"] for t in TURNS if t["question"] in prompt)


def run_bench(out: Path, url: str, *extra: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    argv = ["--task", "debate/gsm8k-v0", "--methods", "cot", "--episodes", str(len(TURNS))]
    argv += ["--backend", "openai", "--base-url", url, "--model", "replayed", "--no-progress"]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            *argv,
            *extra,
            "--data-dir",
            str(data_dir),
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_unread_answers_are_counted_in_the_table_report_and_viewer_with_a_warning(tmp_path, data_dir) -> None:
    out = tmp_path / "run"
    with StubServer(replay) as server:
        proc = run_bench(out, server.url, data_dir=data_dir)
    assert proc.returncode == 0, proc.stderr
    # not one of the 8 turns has a \boxed{}: every answer is unread and scored 0
    assert "| debate/gsm8k-v0 | CoT | 0.000 | exact-match |" in proc.stdout
    assert "| 8 | 8 of 8 (100%) |" in proc.stdout
    warning = "CoT on debate/gsm8k-v0: 8 of 8 (100%) episodes ended with no answer the task could read"
    assert warning in proc.stderr
    row = json.loads((out / "results.json").read_text())["rows"][0]
    assert row["unread"] == 8 and row["episodes"] == 8
    report = (out / "report.md").read_text()
    assert "## Unread answers" in report and warning in report
    assert "unread answers 8 of 8 (100%)" in (out / "viewer.html").read_text()


def test_the_small_style_reads_unboxed_answers_through_task_args(tmp_path, data_dir) -> None:
    out = tmp_path / "small"
    with StubServer(replay) as server:
        proc = run_bench(out, server.url, "--task-arg", "style=small", data_dir=data_dir)
    assert proc.returncode == 0, proc.stderr
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    by_sample = {e["sample_id"]: e for e in episodes}
    # "The answer is: 540" against gold 540: read and scored 1 (the reference reading gives None, 0)
    assert (
        by_sample["gsm8k-test-3"]["final_answer"] == "540" and by_sample["gsm8k-test-3"]["task_score"] == 1.0
    )
    row = json.loads((out / "results.json").read_text())["rows"][0]
    assert row["unread"] == 0 and row["score"] == 1 / 8
    assert "no answer the task could read" not in proc.stderr


def test_a_task_arg_the_task_does_not_take_is_one_clear_error(tmp_path, data_dir) -> None:
    proc = run_bench(tmp_path / "bad", "http://127.0.0.1:9/v1", "--task-arg", "colour=red", data_dir=data_dir)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].count("colour") >= 1
    assert "--task-arg" in proc.stderr or "factory" in proc.stderr
    malformed = run_bench(
        tmp_path / "bad2", "http://127.0.0.1:9/v1", "--task-arg", "style", data_dir=data_dir
    )
    assert malformed.returncode == 2 and "expected NAME=VALUE" in malformed.stderr
