"""The code's shape: one-way imports with no cycles, and one place per concept.

Imports are read from the source (module level, inside functions and under ``TYPE_CHECKING``
alike: a lazy import still couples two modules), so a cycle fails here however it is hidden.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO_ROOT

PACKAGES = ("optima_env", "optima_trainers", "benchmarks")
LAYERS = {
    "optima_env": set(),
    "optima_trainers": {"optima_env"},
    "benchmarks": {"optima_env", "optima_trainers"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own modules (``__init__`` re-exports)
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles() -> None:
    graph = _graph()
    assert graph["optima_trainers.loop"] >= {"optima_trainers.tree_stage", "optima_trainers.sample_stage"}
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_imports_go_one_way_between_the_layers() -> None:
    for name, targets in _graph().items():
        top = name.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            assert other == top or other in LAYERS[top], (
                f"{name} imports {target} ({top} must not use {other})"
            )


def test_one_jsonl_reader_and_one_policy_loader() -> None:
    """Torn-line-tolerant JSONL reading lives in ``optima_env.io.read_jsonl``; loading a policy in
    ``optima_env.backends.loading.load_policy``; the max-turn loss in ``optima_env.readability``."""
    offenders = []
    for name, path in _modules().items():
        source = path.read_text(encoding="utf-8")
        pipes = name.startswith("optima_env.scoring")  # the math worker's stdin protocol, not a file
        if name != "optima_env.io" and not pipes and "json.loads(line" in source:
            offenders.append(f"{name}: reads JSONL lines itself")
        if name not in ("optima_env.backends.loading", "benchmarks.policies") and "def load_policy" in source:
            offenders.append(f"{name}: defines load_policy")
        if name != "optima_env.readability" and "def max_turn_loss" in source:
            offenders.append(f"{name}: defines max_turn_loss")
    assert not offenders, offenders
