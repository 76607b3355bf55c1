"""Imports that go one way: no cycles, each package using only the packages below it, and each
package's subpackages in the layer order its docstring shows (bottom first).

Imports are read from the source (module level, inside functions and under ``TYPE_CHECKING``
alike: a lazy import still couples two modules), so a cycle fails here however it is hidden.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

PACKAGES = ("optima_env", "optima_trainers", "benchmarks")
LAYERS = {
    "optima_env": set(),
    "optima_trainers": {"optima_env"},
    "benchmarks": {"optima_env", "optima_trainers"},
}


def package_modules() -> dict[str, Path]:
    """The modules of :data:`PACKAGES`, by dotted name, to their files."""
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
    found = package_modules()
    known = set(found)
    return {name: _imports(path, name, known) for name, path in found.items()}


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
    assert graph["optima_trainers.host.loop"] >= {"optima_trainers.generation.tree_stage",
                                                  "optima_trainers.generation.samples"}  # fmt: skip
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_imports_go_one_way_between_the_layers() -> None:
    for name, targets in _graph().items():
        top = name.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            assert other == top or other in LAYERS[top], (
                f"{name} imports {target} ({top} must not use {other})"
            )


def _documented_layers(package: str) -> list[str]:
    """The layer order a package's docstring shows: the line of subpackage names joined by ``→``."""
    doc = importlib.import_module(package).__doc__ or ""
    lines = [line.strip() for line in doc.splitlines() if line.count("→") >= 2 and "``" not in line]
    assert len(lines) == 1, f"{package}'s docstring must show its layers once, as 'a → b → c'; found {lines}"
    return [name.strip() for name in lines[0].split("→")]


def _unit(name: str, package: str) -> str | None:
    """The layer unit of module ``name`` of ``package``: its folder (``optima_trainers.run.folder``
    -> ``run``), or, for a root module, its own name (``benchmarks.suites`` -> ``suites``);
    ``None`` for the package itself."""
    parts = name.split(".")
    return parts[1] if parts[0] == package and len(parts) >= 2 else None


def _upward_imports(package: str, order: list[str]) -> list[str]:
    """The imports of ``package`` that go up ``order`` (bottom first). A unit not in the order (a
    root module the docstring does not name: the public API, the hookspecs, the core modules)
    neither is checked nor counts as above anything."""
    rank = {name: i for i, name in enumerate(order)}
    upward = []
    for name, targets in _graph().items():
        unit = _unit(name, package)
        if unit not in rank:
            continue
        for target in targets:
            other = _unit(target, package)
            if other in rank and rank[other] > rank[unit]:
                upward.append(f"{name} -> {target} ({unit} is below {other})")
    return sorted(upward)


@pytest.mark.parametrize("package", PACKAGES)
def test_the_subpackages_import_only_the_layers_below_them(package: str) -> None:
    """Each package's folders are ordered layers (its docstring shows the order, bottom first): a
    module imports only modules of its own folder, of the folders below it, and the package's root
    modules the order does not name. Every folder is in the order; a root module it names (the
    benchmarks' ``suites``, ``args``, ``run``) is a layer like a folder."""
    order = _documented_layers(package)
    root = REPO_ROOT / package
    folders = sorted(p.name for p in root.iterdir() if (p / "__init__.py").is_file())
    named_modules = sorted(set(order) - set(folders))
    assert set(folders) <= set(order), f"the docstring's layers {order} must name every folder {folders}"
    missing = [m for m in named_modules if not (root / f"{m}.py").is_file()]
    assert not missing, f"the docstring's layers {order} name {missing}, neither a folder nor a module"
    upward = _upward_imports(package, order)
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_the_layer_check_sees_an_upward_import() -> None:
    """Each order read upside down has upward imports (e.g. the demo using the evaluation), and the
    benchmarks' former ``demo <-> suites`` cycle would be one: the demo sits below the suites."""
    for package in PACKAGES:
        order = _documented_layers(package)
        assert _upward_imports(package, order[::-1]), package
    upside_down = _upward_imports("optima_env", _documented_layers("optima_env")[::-1])
    assert any(line.startswith("optima_env.families.") and "datasets" in line for line in upside_down)
    order = _documented_layers("benchmarks")
    assert order.index("demo") < order.index("suites") < order.index("run")
