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
