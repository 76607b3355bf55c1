"""benchmarks.run at its edges (issue 15): clear one-line errors, the OpenAI-compatible backend
against a real HTTP server on 127.0.0.1, the task's own metric in the report, and file modes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from benchmarks.run import main
from optima_env import AgentView, TaskSpec, hookimpl
from optima_env.io import read_episodes
from tests.helpers import REPO_ROOT, TinyTask

URL = "http://127.0.0.1:8000/v1"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.run", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_url_as_model_is_one_clear_line_and_exit_code_2(tmp_path) -> None:
    proc = _run("--model", URL, "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and proc.stderr.rstrip().endswith(lines[0])
    assert f"--model '{URL}' is a URL" in lines[0]
    assert f"pass --backend openai --base-url {URL} --model <the model name the server serves>" in lines[0]


def test_debug_adds_the_traceback(tmp_path) -> None:
    proc = _run("--model", URL, "--debug", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr and "TaskContractError" in proc.stderr
    assert len(error_lines(proc.stderr)) == 1


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--backend", "openai", "--model", "served-model"],
            "--backend openai needs the server: add --base-url",
        ),
        (["--base-url", URL, "--model", "embedded"], "--base-url is for --backend openai"),
        (["--backend", "openai", "--base-url", URL, "--model", URL], "is a URL"),
        (
            ["--backend", "openai", "--base-url", "ftp://x", "--model", "m"],
            "base_urls must be one or more http",
        ),
    ],
)
def test_openai_flag_mistakes_are_one_line_errors(tmp_path, capsys, flags, message) -> None:
    code = main([*flags, "--task", "ie/synth-v0", "--episodes", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert len(error_lines(err)) == 1 and message in error_lines(err)[0]


def test_backend_openai_plays_against_an_openai_compatible_server(tmp_path, capsys, monkeypatch) -> None:
    pytest.importorskip("httpx")
    from tests.optima_env.test_backends_openai import StubServer

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
