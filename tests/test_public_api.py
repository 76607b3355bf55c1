"""The public surface: what the README and ``examples/`` import is reachable from the package top level.

The README's python blocks are parsed (not run: several need a model or TRL); every name they or
the examples import from ``optima_env`` / ``optima_trainers`` (deep imports included) must be an
attribute of the package and listed in its ``__all__``, and the README imports only from the top
level, so a user copies the short form. The one other public namespace is
``<package>.integrations.<framework>``: adapters to another framework (TRL, verifiers), whose names
(``evaluate``, ``reward_functions``) only mean something next to the framework's name and whose
modules may need an extra; what the README imports from one must be in that module's ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

PACKAGES = ("optima_env", "optima_trainers")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE)


def imported_names(code: str) -> list[tuple[str, str]]:
    """``(module, name)`` of every ``from optima_env... import name`` / ``from optima_trainers...``
    in ``code``; a plain ``import optima_env.x.y`` gives ``("optima_env.x", "y")``."""
    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] in PACKAGES:
                out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                module, _, name = alias.name.rpartition(".")
                if module.split(".")[0] in PACKAGES:
                    out.append((module, name))
    return out


def readme_imports() -> list[tuple[str, str]]:
    blocks = python_blocks((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    return [pair for block in blocks for pair in imported_names(block)]


def example_imports() -> list[tuple[str, str]]:
    paths = sorted((REPO_ROOT / "examples").rglob("*.py"))
    return [
        pair
        for path in paths
        if "tests" not in path.relative_to(REPO_ROOT / "examples").parts
        for pair in imported_names(path.read_text(encoding="utf-8"))
    ]


INTEGRATION = re.compile(r"^(?:optima_env|optima_trainers)\.integrations\.[a-z][a-z0-9_]*$")


def module_all(module: str) -> list[str]:
    """``module.__all__`` read from its source (an integration module may need an extra to import)."""
    path = REPO_ROOT / (module.replace(".", "/") + ".py")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def unreachable(pairs: list[tuple[str, str]]) -> list[str]:
    """The imported names that are not in their package's ``__all__`` or not an attribute of it
    (for an integration module: not in that module's ``__all__``)."""
    missing = []
    for module, name in pairs:
        if INTEGRATION.match(module):
            if name not in module_all(module):
                missing.append(f"{name} (imported from {module}): add it to that module's __all__")
            continue
        top = importlib.import_module(module.split(".")[0])
        if module == top.__name__ and name[:1].islower() and f"{module}.{name}" in sys.modules:
            continue  # ``from optima_env import io``-style submodule imports
        if name not in top.__all__ or not hasattr(top, name):
            missing.append(f"{name} (imported from {module}): add it to {top.__name__}.__all__")
    return sorted(set(missing))


def test_the_parsers_see_the_imports() -> None:
    code = (
        "import optima_env\nimport optima_trainers.host.loop\n"
        "from optima_env.policy import A, B\nimport os.path\n"
    )
    assert sorted(imported_names(code)) == [
        ("optima_env.policy", "A"),
        ("optima_env.policy", "B"),
        ("optima_trainers.host", "loop"),
    ]
    pairs = readme_imports()
    assert ("optima_env", "SamplingParams") in pairs and ("optima_env", "check_task") in pairs
    assert {m.split(".")[0] for m, _ in pairs} == set(PACKAGES)
    assert example_imports(), "examples/ import nothing from the packages?"


def test_every_name_the_readme_and_examples_import_is_reachable_from_the_top_level() -> None:
    assert unreachable(readme_imports() + example_imports()) == []
    assert unreachable(
        [("optima_env.policy", "NoSuchName"), ("optima_trainers.integrations.trl", "Nope")]
    ) == [
        "NoSuchName (imported from optima_env.policy): add it to optima_env.__all__",
        "Nope (imported from optima_trainers.integrations.trl): add it to that module's __all__",
    ]
    assert INTEGRATION.match("optima_env.integrations.verifiers") and not INTEGRATION.match(
        "optima_env.rollout"
    )


def test_the_readme_imports_from_the_top_level() -> None:
    deep = sorted(
        {
            f"from {m} import {n}"
            for m, n in readme_imports()
            if m not in PACKAGES and not INTEGRATION.match(m)
        }
    )
    assert deep == [], f"the README's code imports from deep modules; import from the package: {deep}"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves_and_the_import_stays_light(package: str) -> None:
    """Every ``__all__`` name resolves (a lazy attribute whose module moved fails here), and importing
    the package and resolving every one of them (the engines included) never imports torch."""
    code = (
        f"import sys, {package} as p\n"
        "assert 'torch' not in sys.modules, 'importing the package imported torch'\n"
        "missing = [n for n in p.__all__ if not hasattr(p, n)]\n"
        "assert not missing, f'__all__ names that do not resolve: {missing}'\n"
        "assert len(set(p.__all__)) == len(p.__all__), 'duplicates in __all__'\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_rollout_at_the_top_level_is_the_function_and_the_module_still_imports() -> None:
    import optima_env
    from optima_env.rollout import make_jobs

    assert callable(optima_env.rollout) and optima_env.rollout.__name__ == "rollout"
    assert optima_env.make_jobs is make_jobs
    assert Path(sys.modules["optima_env.rollout"].__file__).name == "rollout.py"


# --- console scripts ----------------------------------------------------------------------------

# `python -m` commands of the README without a console script, and why.
NO_SCRIPT = {
    "benchmarks.demo.rerender": "repository maintenance: rewrites the committed demo report and README",
    "benchmarks.demo.train_one": "repository maintenance: trains one run into the committed demo's folder",
    "benchmarks.demo.probe": "repository maintenance: the demo recipe's probe before its full runs",
    "benchmarks.throughput.gpu_check": "a device check run through the device tool from the repository root",
    "optima_env.check": "a plugin author's check, run with the interpreter the plugin is installed in; an "
    "optima-check script needs the shared environment reinstalled (pip install -e .)",
}


def project_scripts() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(REPO_ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["scripts"]


def test_every_readme_command_has_a_console_script_calling_the_same_main() -> None:
    scripts = project_scripts()
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    commands = set(re.findall(r"python -m ((?:optima_env|optima_trainers|benchmarks)(?:\.\w+)+)", readme))
    assert "optima_trainers.train" in commands and "benchmarks.run" in commands
    targets = {}
    for name, value in scripts.items():
        module, _, function = value.partition(":")
        targets[name] = getattr(importlib.import_module(module), function)
    for command in sorted(commands - set(NO_SCRIPT)):
        main = importlib.import_module(command).main
        assert main in targets.values(), (
            f"`python -m {command}` has no [project.scripts] entry calling its main"
        )


def test_the_console_scripts_are_installed_and_answer_help() -> None:
    """After ``pip install -e .`` each script sits beside the interpreter and ``--help`` exits 0."""
    from importlib.metadata import entry_points

    installed = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    bindir = Path(sys.executable).parent
    procs = {}
    for name, value in project_scripts().items():
        assert installed.get(name) == value, (
            f"console script {name} is not installed as {value!r} (got {installed.get(name)!r}); "
            "reinstall the project: pip install -e ."
        )
        assert (bindir / name).is_file(), (
            f"{bindir / name} is missing; reinstall the project: pip install -e ."
        )
        procs[name] = subprocess.Popen(
            [str(bindir / name), "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name} --help exited {proc.returncode}: {out[-2000:]}"
        assert "usage:" in out, out[:2000]
