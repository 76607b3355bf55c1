"""benchmarks.run end to end in a subprocess (scripted policy: no model), as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from optima_env import list_tasks
from optima_env.io import read_episodes
from tests.benchmarks.bench_helpers import assert_png
from tests.helpers import REPO_ROOT


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.run", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_run_writes_episodes_table_results_report_plot_and_viewer(tmp_path) -> None:
    out = tmp_path / "run"
    proc = _run("--model", "scripted", "--episodes", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    # the main suite: CoT, MAD and the one-hand control on the embedded task, a table row each
    assert "| task | method | score | scorer | mean #tokens | episodes | unread answers |" in proc.stdout
    assert "| ie/synth-v1 | CoT |" in proc.stdout and "| ie/synth-v1 | MAD |" in proc.stdout
    assert "Shortcut ceiling (computed: no bridging evidence passed on) | 0.125" in proc.stdout

    episodes = read_episodes(out / "episodes.jsonl")
    assert len(episodes) == 9 and all(e.reward is not None for e in episodes)
    assert {e.metadata["method"] for e in episodes} == {"cot", "mad", "one_hand"}
    assert {len(e.agents) for e in episodes if e.metadata["method"] in ("cot", "one_hand")} == {1}
    assert {len(e.agents) for e in episodes if e.metadata["method"] == "mad"} == {2}

    results = json.loads((out / "results.json").read_text())
    assert {"rows", "tasks", "methods", "curves", "git_commit", "wall_time_s", "model", "data_dir"} <= set(
        results
    )
    assert results["settings"]["seed"] == 0 and results["model"] == "scripted"
    for row in results["rows"]:
        mine = [e for e in episodes if e.metadata["method"] == row["method_key"]]
        assert row["episodes"] == 3 and row["instances"] == 3 and row["status"] == "ok"
        assert row["mean_tokens"] == sum(e.num_tokens for e in mine) / 3
        assert row["score"] == sum(e.task_score for e in mine) / 3
    assert any(row["score"] > 0 for row in results["rows"])  # the scripted policy reads its facts

    report = (out / "report.md").read_text()
    assert "- **suite**: main\n" in report and not (out / ".lock").exists()
    assert "| Method | ie/synth-v1 names-gold | #Tok |" in report
    assert "| task | method | score |" in report and "git commit" in report and "wall time" in report
    assert_png(out / "score_vs_tokens.png")
    viewer = (out / "viewer.html").read_text()
    assert "&lt;A&gt;" in viewer and "<A>" not in viewer  # model output is escaped


def test_help_documents_the_flags() -> None:
    proc = _run("--help")
    assert proc.returncode == 0
    for flag in (
        "--suite",
        "--task",
        "--methods",
        "--checkpoint",
        "--backend",
        "--model",
        "--episodes",
        "--seed",
    ):
        assert flag in proc.stdout
    assert "--out" in proc.stdout and "resume" in proc.stdout


def test_unknown_task_is_a_clear_error_not_a_traceback() -> None:
    proc = _run("--task", "nope", "--model", "scripted")
    assert proc.returncode == 2 and "no task 'nope'; registered:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_suite_and_method_are_clear_errors(tmp_path) -> None:
    proc = _run("--suite", "nope", "--model", "scripted", "--out", str(tmp_path / "a"))
    assert proc.returncode == 2 and "no suite 'nope'; expected one of main, smoke, paper" in proc.stderr
    proc = _run("--methods", "cot,tot", "--model", "scripted", "--out", str(tmp_path / "b"))
    assert proc.returncode == 2 and "unknown method 'tot'" in proc.stderr


@pytest.mark.skipif("ie/hotpotqa-v0" not in list_tasks(), reason="the HotpotQA task plugin is not installed")
@pytest.mark.slow
def test_a_task_without_data_is_reported_and_fails_the_command_unless_allowed(tmp_path) -> None:
    """The run goes on and writes its outputs with the task's ``data missing`` row, then exits 2 with
    one line naming the task, so a script does not take it for success; ``--allow-missing`` exits 0."""
    empty = tmp_path / "no-data"
    empty.mkdir()
    env = {"OPTIMA_DATA_DIR": str(empty), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "run"
    tasks = "ie/hotpotqa-v0,ie/synth-v0"
    args = ("--model", "scripted", "--task", tasks, "--episodes", "2", "--out", str(out))
    proc = _run(*args, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "got 1 of 2 not evaluated: ie/hotpotqa-v0 (data missing: " in errors[0]
    assert "--allow-missing" in errors[0]
    assert "| ie/hotpotqa-v0 | CoT | data missing: " in proc.stdout
    assert "| ie/synth-v0 | CoT | " in proc.stdout
    report = (out / "report.md").read_text()
    assert "ie/hotpotqa-v0: data missing: " in report and str(empty) in report
    assert f"- **suite**: custom: --task {tasks}, main's settings\n" in report
    assert not (out / ".lock").exists()

    allowed = _run(*args, "--allow-missing", env=env)
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "| ie/hotpotqa-v0 | CoT | data missing: " in allowed.stdout
    alone = _run("--model", "scripted", "--task", "ie/hotpotqa-v0", "--out", str(tmp_path / "alone"), env=env)
    assert alone.returncode == 2 and "got 1 of 1 not evaluated" in alone.stderr, alone.stderr[-2000:]


@pytest.mark.slow
def test_reward_weights_and_task_thresholds_are_set_from_the_command_line(tmp_path) -> None:
    """``--set reward.NAME=VALUE`` reaches the reward of every episode, typed; a bad name fails first."""
    default, tuned = tmp_path / "default", tmp_path / "tuned"
    args = ("--model", "scripted", "--episodes", "2", "--methods", "mad")
    assert _run(*args, "--out", str(default)).returncode == 0
    proc = _run(*args, "--out", str(tuned), "--set", "reward.lambda_token=0.3",
                "--set", "reward.short_trajectory_tokens=none")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    before, after = read_episodes(default / "episodes.jsonl"), read_episodes(tuned / "episodes.jsonl")
    for a, b in zip(before, after):
        assert [t.text for t in a.turns] == [t.text for t in b.turns]
        assert "short_trajectory" not in b.reward.flags
        if "short_trajectory" not in a.reward.flags and "large_turn" not in a.reward.flags:
            assert b.reward.token == pytest.approx(a.reward.token * 0.3 / 0.6)
    bad = _run(*args, "--out", str(tmp_path / "bad"), "--set", "reward.lambda_token=-1")
    assert bad.returncode == 2 and "lambda_token must be a number >= 0" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_the_recorded_commit_says_dirty_when_code_differs_from_it_but_not_for_the_runs_own_outputs(
    tmp_path,
) -> None:
    from benchmarks.run import _git_commit

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    for name in ("README.md", "recipe.py", "benchmarks/results/results.json"):
        (tmp_path / name).write_text("v1\n", encoding="utf-8")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "one")
    head = git("rev-parse", "HEAD")
    assert _git_commit(tmp_path) == head
    (tmp_path / "README.md").write_text("v2\n", encoding="utf-8")  # the demo rewrites its block
    (tmp_path / "benchmarks" / "results" / "results.json").write_text("v2\n", encoding="utf-8")
    (tmp_path / "untracked.py").write_text("x\n", encoding="utf-8")
    assert _git_commit(tmp_path) == head
    (tmp_path / "recipe.py").write_text("v2\n", encoding="utf-8")  # the recipe is not HEAD's
    assert _git_commit(tmp_path) == f"{head}-dirty"
    assert _git_commit(tmp_path / "missing") is None  # no checkout there: no commit to record
