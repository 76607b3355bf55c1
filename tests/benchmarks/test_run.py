"""``optima-bench`` (``python -m benchmarks.run``) as a user runs it, with the scripted policy (no
model): the files it writes, its help, its flags, the OpenAI-compatible backend against a stub
server on 127.0.0.1, each task's own metric in the report, and file modes. Its answers to mistakes:
``test_run_errors.py``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import replace

import pytest

from benchmarks.demo.tasks import MAIN_TASK
from benchmarks.evaluate import suite_adapters
from benchmarks.run import main
from benchmarks.suites import get_suite
from optima_env import AgentView, TaskSpec, hookimpl, list_tasks
from optima_env.io import read_episodes
from tests.benchmarks.bench_helpers import assert_png
from tests.helpers import REPO_ROOT, TinyTask

ONE_THREAD = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


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
    from benchmarks.evaluate import checkout_commit

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
    assert checkout_commit(tmp_path) == head
    (tmp_path / "README.md").write_text("v2\n", encoding="utf-8")  # the demo rewrites its block
    (tmp_path / "benchmarks" / "results" / "results.json").write_text("v2\n", encoding="utf-8")
    (tmp_path / "untracked.py").write_text("x\n", encoding="utf-8")
    assert checkout_commit(tmp_path) == head
    (tmp_path / "recipe.py").write_text("v2\n", encoding="utf-8")  # the recipe is not HEAD's
    assert checkout_commit(tmp_path) == f"{head}-dirty"
    assert checkout_commit(tmp_path / "missing") is None  # no checkout there: no commit to record


def test_backend_openai_plays_against_an_openai_compatible_server(tmp_path, capsys, monkeypatch) -> None:
    pytest.importorskip("httpx")
    from tests.optima_env.backends.test_openai import StubServer

    secret = "sk-bench-test-secret-42"
    monkeypatch.setenv("MY_SERVER_KEY", secret)
    out = tmp_path / "run"
    with StubServer(lambda n, body: ("ok", "I say <A>Lantern</A>")) as server:
        code = main([
            "--backend", "openai", "--base-url", server.url, "--api-key-env", "MY_SERVER_KEY",
            "--model", "served-model", "--task", "ie/synth-v0", "--methods", "cot,mad", "--episodes", "2",
            "--out", str(out),
        ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert server.requests and {r["model"] for r in server.requests} == {"served-model"}
    assert {h.get("Authorization") for h in server.headers} == {f"Bearer {secret}"}
    episodes = read_episodes(out / "episodes.jsonl")
    assert len(episodes) == 4 and {e.metadata["method"] for e in episodes} == {"cot", "mad"}
    mad = [e for e in episodes if e.metadata["method"] == "mad"]
    assert all(e.end_reason == "agreement" and e.final_answer == "Lantern" for e in mad)
    assert [t.text for t in mad[0].turns] == ["Alice: I say <A>Lantern</A>", "Bob: I say <A>Lantern</A>"]
    results = json.loads((out / "results.json").read_text())
    assert results["backend"] == "openai" and results["config"]["base_url"] == [server.url]
    assert "regex approximation (--backend openai without --tokenizer)" == results["token_counter"]
    for path in out.iterdir():  # the key is never written anywhere
        assert secret not in path.read_text(errors="replace"), path


class ExactMatchTask(TinyTask):
    """The tiny task scored by exact match (it declares its metric)."""

    metric = "exact match"

    def views(self, sample, *, rng, format_index=None):
        clue = f"The answer to {sample.id} is in the atlas."  # the evidence it declares
        return {
            a: AgentView(agent=a, system_prompt=f"{v.system_prompt} {clue}",
                         base_system_prompt=f"{v.system_prompt} {clue}", private=(clue,))
            for a, v in super().views(sample, rng=rng, format_index=format_index).items()
        }  # fmt: skip

    def score(self, answer, sample) -> float:
        return float(answer is not None and answer.strip() in sample.answers)


class ExactMatchPlugin:
    @hookimpl
    def optima_register_tasks(self) -> list[TaskSpec]:
        return [TaskSpec(id="test/exact-v0", factory=ExactMatchTask, family="information_exchange")]


def test_the_report_names_each_tasks_metric_and_files_follow_the_umask(test_pm, bench) -> None:
    plugin = ExactMatchPlugin()
    test_pm.register(plugin)
    old = os.umask(0o027)
    try:
        results, out = bench(
            "--model", "scripted", "--task", "test/exact-v0,ie/synth-v0", "--methods", "cot",
            "--episodes", "2", pm=test_pm,
        )  # fmt: skip
    finally:
        os.umask(old)
        test_pm.unregister(plugin)
    assert {t["task"]: t["metric"] for t in results["tasks"]} == {
        "test/exact-v0": "exact match",
        "ie/synth-v0": "F1",
    }
    report = (out / "report.md").read_text()
    assert "| Method | test/exact-v0 exact match | #Tok | ie/synth-v0 F1 | #Tok |" in report
    assert "(exact match / F1 in %" in report
    scorers = {(r["task"], r["method"]): r["scorer"] for r in results["rows"]}
    assert scorers[("test/exact-v0", "CoT")] == "exact match"  # the task's metric, not test/exact-v0.score
    assert "| test/exact-v0 | CoT | " in report and "test/exact-v0.score" not in report
    assert results["suite"] == "custom: --task test/exact-v0,ie/synth-v0, main's settings"
    assert "- **suite**: custom: --task test/exact-v0,ie/synth-v0, main's settings\n" in report
    assert not (out / ".lock").exists()  # the run's lock went with it
    for name in ("report.md", "results.json", "viewer.html", "episodes.jsonl", "run_config.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o640, name


@pytest.mark.parametrize("tasks, played", [([MAIN_TASK.task], True), (["test/tiny-v0"], False)])
def test_main_suite_adapters_play_only_on_their_task(tasks, played, monkeypatch) -> None:
    suite = replace(get_suite("main"), adapters=(("iSFT", "adapters/isft"), ("iDPO", "adapters/idpo")))
    monkeypatch.setattr("benchmarks.evaluate.is_adapter", lambda folder: True)  # as if the demo had run
    adapters = suite_adapters(suite, tasks)
    assert (sorted(adapters) == sorted(label for label, _ in suite.adapters)) is played
    assert bool(adapters) is played


@pytest.mark.slow
def test_no_progress_silences_every_bar_and_help_names_per_agent_models(tmp_path) -> None:
    flags = ("--model", "scripted", "--methods", "cot", "--episodes", "2")
    shown = _run(*flags, "--out", str(tmp_path / "a"), env=ONE_THREAD)
    quiet = _run(*flags, "--no-progress", "--out", str(tmp_path / "b"), env=ONE_THREAD)
    assert shown.returncode == quiet.returncode == 0, quiet.stderr[-2000:]
    assert "ep/s" in shown.stderr  # the rollout's bar, on by default
    assert "ep/s" not in quiet.stderr and "it/s" not in quiet.stderr
    help_text = _run("--help", env=ONE_THREAD).stdout
    assert "AGENT=MODEL[,AGENT=MODEL...]" in help_text and "--no-progress" in help_text
