"""Secure defaults, checked on the source: no trust_remote_code, no eval/exec, safe loading."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

SOURCE_DIRS = ("optima_env", "optima_trainers", "plugins", "benchmarks", "examples")


def python_files() -> list[Path]:
    files = []
    for folder in SOURCE_DIRS:
        root = REPO_ROOT / folder
        if root.is_dir():
            files.extend(p for p in root.rglob("*.py") if ".venv" not in p.parts)
    return sorted(files)


def calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def dotted(func: ast.expr) -> str:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def unsafe_calls(source: str, filename: str) -> list[str]:
    """Every forbidden call in ``source``, as ``file:line: reason``."""
    problems = []
    for call in calls(ast.parse(source, filename=filename)):
        name = dotted(call.func)
        line = f"{filename}:{call.lineno}"
        if name in {"eval", "exec", "builtins.eval", "builtins.exec"}:
            problems.append(f"{line}: {name}() is forbidden (model output must never run as code)")
        if name in {"pickle.load", "pickle.loads", "dill.load", "dill.loads", "cloudpickle.load"}:
            problems.append(f"{line}: {name}() can run arbitrary code on untrusted data")
        for kw in call.keywords:
            enabled = not (isinstance(kw.value, ast.Constant) and kw.value.value is False)
            if kw.arg == "trust_remote_code" and enabled:
                problems.append(f"{line}: trust_remote_code must never be enabled")
        if name.endswith("torch.load"):
            flags = [kw.value for kw in call.keywords if kw.arg == "weights_only"]
            if not (flags and isinstance(flags[0], ast.Constant) and flags[0].value is True):
                problems.append(f"{line}: torch.load needs weights_only=True")
    return problems


@pytest.mark.parametrize("path", python_files(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_source_file_has_no_unsafe_calls(path: Path) -> None:
    problems = unsafe_calls(path.read_text(encoding="utf-8"), str(path.relative_to(REPO_ROOT)))
    assert not problems, "\n".join(problems)


def test_the_checker_catches_what_it_forbids() -> None:
    bad = (
        "import torch, pickle\neval('1')\ntorch.load('x')\ntorch.load('y', weights_only=False)\n"
        "pickle.loads(b'')\nf(trust_remote_code=True)\ng(trust_remote_code=flag)\n"
        "torch.load('ok', weights_only=True)\nh(trust_remote_code=False)\n"
    )
    problems = unsafe_calls(bad, "bad.py")
    assert [p.split(":")[1] for p in problems] == ["2", "3", "4", "5", "6", "7"]


def test_sources_were_found() -> None:
    assert len(python_files()) > 20


# -- API keys: read from the environment only, never written to a run folder or a log ------------
SECRET = "sk-test-SECRET-5f1c9a7e"


def _assert_no_secret(folder: Path, *texts: str) -> None:
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files, f"nothing was written under {folder}"
    leaked = [str(p) for p in files if SECRET.encode() in p.read_bytes()]
    assert not leaked, f"the API key was written to {leaked}"
    assert all(SECRET not in text for text in texts), "the API key reached the output or the logs"


def test_benchmark_run_folder_and_output_hold_no_api_key(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "OPENAI_API_KEY": SECRET, "OPTIMA_API_KEY": SECRET, "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "bench"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--model", "scripted", "--episodes", "1", "--out", str(out)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "episodes.jsonl").is_file() and (out / "results.json").is_file()
    _assert_no_secret(out, done.stdout, done.stderr)


def test_episodes_generated_with_a_keyed_server_hold_no_api_key(tmp_path: Path, monkeypatch, caplog) -> None:
    """The OpenAI-compatible backend sends the key to the server, and nowhere else."""
    import logging

    from optima_env.policy import SamplingParams
    from optima_env.registry import make_task
    from optima_env.rollout import make_jobs
    from optima_trainers.config.train import resolve_config
    from optima_trainers.generation.rollouts import resumable_rollout
    from optima_trainers.run.folder import RunDir
    from tests.optima_env.backends.test_openai import StubServer, echo, fast_policy

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    run = RunDir.create(resolve_config("ie/synth-v0", "isft"), run_dir=tmp_path / "run")
    with StubServer(echo) as server, fast_policy(server.url) as policy:
        episodes = resumable_rollout(
            make_task("ie/synth-v0"),
            policy,
            jobs=make_jobs(range(2), 1, seed=0),
            path=run.stage("iter_00") / "episodes.jsonl",
            sampling=SamplingParams(max_new_tokens=8),
            env_kwargs={"max_turns": 2},
            concurrency=2,
            progress=False,
        )
    assert len(episodes) == 2 and server.headers[0]["Authorization"] == f"Bearer {SECRET}"
    run.record_phase("iter_00", "generate", 0.1)
    _assert_no_secret(run.root, caplog.text)
