"""The code's shape: one place per concept (one JSONL reader, one policy loader, one exception
tree, one declaration per setting), no torch at import time, and no private env module used
outside the env. The import layers are checked in ``tests/test_layers.py``.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import importlib
import re

import pytest

from tests.helpers import REPO_ROOT
from tests.test_layers import package_modules


def _module_level_imports(source: str) -> set[str]:
    """Modules imported when a module is imported: outside functions, not under ``TYPE_CHECKING``."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level:
                found.add(node.module or "")
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    visit(
                        [c for c in children if isinstance(c, ast.stmt)]
                        + [s for h in children if isinstance(h, ast.ExceptHandler) for s in h.body]
                    )

    visit(ast.parse(source).body)
    return found


def test_the_module_level_import_finder_skips_functions_and_type_checking() -> None:
    source = (
        "import json\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
        "try:\n    import numpy\nexcept ImportError:\n    import array\n"
        "def f():\n    import transformers\nclass C:\n    import re\n"
    )
    assert _module_level_imports(source) == {"json", "typing", "numpy", "array", "re"}


@pytest.mark.parametrize("package", ["optima_env", "optima_trainers"])
def test_no_module_imports_torch_when_it_is_imported(package: str) -> None:
    """``optima_env`` and ``optima_trainers`` import torch only inside the functions that need it."""
    found = [
        str(path.relative_to(REPO_ROOT))
        for name, path in package_modules().items()
        if name.split(".")[0] == package
        and any(m.split(".")[0] == "torch" for m in _module_level_imports(path.read_text(encoding="utf-8")))
    ]
    assert not found, f"torch imported at module level (import it inside the function): {found}"


def test_one_jsonl_reader_and_one_policy_loader() -> None:
    """Torn-line-tolerant JSONL reading lives in ``optima_env.io.read_jsonl``; loading a policy in
    ``optima_env.backends.loading.load_policy``; the max-turn loss in ``optima_env.readability``."""
    offenders = []
    for name, path in package_modules().items():
        source = path.read_text(encoding="utf-8")
        pipes = name.startswith("optima_env.scoring")  # the math worker's stdin protocol, not a file
        if name != "optima_env.io" and not pipes and "json.loads(line" in source:
            offenders.append(f"{name}: reads JSONL lines itself")
        loaders = ("optima_env.backends.loading", "benchmarks.evaluation.policies")
        if name not in loaders and "def load_policy" in source:
            offenders.append(f"{name}: defines load_policy")
        if name != "optima_env.readability" and "def max_turn_loss" in source:
            offenders.append(f"{name}: defines max_turn_loss")
    assert not offenders, offenders


# --- one exception tree ------------------------------------------------------------------------

_BUILTIN_ERRORS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, Exception)
}


def _exception_classes(sources: dict[str, str]) -> set[tuple[str, str]]:
    """``(module, class)`` of every class in ``sources`` that derives, by the names of its bases
    (``errors.DataError`` counts as ``DataError``), from a builtin exception or from such a class."""
    classes = []
    for name, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
                classes.append((name, node.name, bases))
    known, found = set(_BUILTIN_ERRORS), set()
    while True:
        new = {(m, c) for m, c, bases in classes if bases & known} - found
        if not new:
            return found
        found |= new
        known |= {c for _, c in new}


def _drawn_tree() -> dict[str, tuple[str | None, str | None]]:
    """Each class drawn in ``errors.py``'s docstring: ``(drawn parent, builtin in parentheses)``."""
    from optima_env import errors

    drawn: dict[str, tuple[str | None, str | None]] = {}
    parents: list[str] = []
    for line in errors.__doc__.splitlines():
        match = re.match(r"^(\s*)((?:[│ ]   )*)(?:[├└]── )?(\w+Error)\b(?:\s+\((\w+)\))?", line)
        if not match or ("──" not in line and match.group(3) != "OptimaError"):
            continue
        depth = len(match.group(2)) // 4 + ("──" in line)
        del parents[depth:]
        drawn[match.group(3)] = (parents[-1] if parents else None, match.group(4))
        parents.append(match.group(3))
    return drawn


def test_the_exception_finder_and_the_tree_reader_see_what_they_look_for() -> None:
    code = "class A(ValueError): ...\nclass B(errors.A): ...\nclass C: ...\nclass D(B, C): ...\n"
    assert _exception_classes({"m": code}) == {("m", "A"), ("m", "B"), ("m", "D")}
    drawn = _drawn_tree()
    assert drawn["OptimaError"] == (None, None)
    assert drawn["TaskContractError"] == ("OptimaError", "ValueError")
    assert drawn["EpisodeOverError"] == ("TaskContractError", None)


def test_every_exception_class_derives_from_optima_error_lives_in_errors_and_is_drawn() -> None:
    """Every exception of the three packages is an ``OptimaError`` (and keeps its builtin base),
    defined in ``optima_env.errors`` and drawn in its docstring under its real parent. Classes that
    derive from ``BaseException`` alone (a worker's timeout signal, a ``KeyboardInterrupt``
    refinement) are control flow, not errors a caller handles, and are left out."""
    from optima_env import errors

    sources = {name: path.read_text(encoding="utf-8") for name, path in package_modules().items()}
    drawn = _drawn_tree()
    offenders = []
    for module, name in sorted(_exception_classes(sources)):
        cls = getattr(importlib.import_module(module), name)
        if not issubclass(cls, Exception):
            continue
        where = f"{module}.{name}"
        if not issubclass(cls, errors.OptimaError) and cls is not errors.OptimaError:
            offenders.append(f"{where}: derive it from optima_env.errors.OptimaError (and its builtin)")
        if getattr(errors, name, None) is not cls:
            offenders.append(f"{where}: define it in optima_env/errors.py and import it from there")
        if name not in drawn:
            offenders.append(f"{where}: draw it in the tree of optima_env/errors.py's docstring")
            continue
        parent, builtin = drawn[name]
        bases = [b.__name__ for b in cls.__bases__]
        expected = [b for b in (parent, builtin) if b] or ["Exception"]
        if bases != expected:
            offenders.append(f"{where}: drawn as {expected}, defined with bases {bases}")
    assert not offenders, "\n".join(offenders)
    assert set(drawn) <= set(errors.__all__), f"drawn but not defined: {set(drawn) - set(errors.__all__)}"


# --- no private env module outside the env ------------------------------------------------------

# Clients of optima_env: the other packages, the plugins, the examples and the tests, except the
# env's own white-box tests (tests/optima_env/, which may test a private module directly).
_CLIENT_ROOTS = ("optima_trainers", "benchmarks", "plugins", "examples", "tests")
_EXEMPT = ("tests/optima_env/",)


def _private_env_imports(source: str) -> list[str]:
    """Every ``optima_env`` module or name imported by ``source`` with a dotted component that starts
    with ``_`` (``optima_env._x``, ``from optima_env.a import _x``, ``import_module("optima_env._x")``)."""
    targets = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            targets += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                targets.append(first.value)
    return [
        t
        for t in targets
        if t.split(".")[0] == "optima_env" and any(p.startswith("_") for p in t.split(".")[1:])
    ]


def test_the_private_import_finder_sees_each_form() -> None:
    code = (
        "import optima_env.backends._kv\nfrom optima_env import _termination, io\n"
        "from optima_env.reward import _weights, RewardConfig\nfrom optima_env.rules import checked_score\n"
        "importlib.import_module('optima_env._env_checks')\nfrom . import _local\n"
    )
    assert _private_env_imports(code) == [
        "optima_env.backends._kv",
        "optima_env._termination",
        "optima_env.reward._weights",
        "optima_env._env_checks",
    ]


def test_no_private_env_module_is_imported_from_outside_the_env() -> None:
    offenders = []
    for root in _CLIENT_ROOTS:
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            relative = path.relative_to(REPO_ROOT).as_posix()
            if relative.startswith(_EXEMPT):
                continue
            offenders += [f"{relative}: {t}" for t in _private_env_imports(path.read_text(encoding="utf-8"))]
    assert not offenders, (
        "private optima_env modules or names used outside the env (make what they need public, as "
        f"optima_env.rules is): {offenders}"
    )


# --- one declaration per setting ----------------------------------------------------------------

_CONFIG_SUFFIXES = ("Config", "Options", "Settings")
_SAME_DOC = 0.85  # docstrings at least this similar (difflib ratio) state the same setting


def _dataclass_fields(sources: dict[str, str]) -> dict[tuple[str, str], dict[str, str]]:
    """``{(module, class): {field: its docstring, whitespace collapsed}}`` of every dataclass."""
    out = {}
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            decorators = [ast.unparse(d) for d in getattr(node, "decorator_list", [])]
            if not isinstance(node, ast.ClassDef) or not any("dataclass" in d for d in decorators):
                continue
            fields = {}
            for i, stmt in enumerate(node.body):
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    after = node.body[i + 1] if i + 1 < len(node.body) else None
                    doc = (
                        after.value.value
                        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                        else ""
                    )
                    fields[stmt.target.id] = " ".join(str(doc).split())
            out[(module, node.name)] = fields
    return out


def _configuration_tree() -> set[tuple[str, str]]:
    """``(module, class)`` of every section of the run's configuration: ``TrainConfig`` and the
    dataclasses its fields hold (recursively), and each registered trainer's options class."""
    import dataclasses
    import typing

    from optima_env.registry import get_plugin_manager
    from optima_trainers.config.train import TrainConfig

    roots: list[type] = [TrainConfig]
    specs = [spec for specs in get_plugin_manager().hook.optima_register_trainers() for spec in specs]
    names = {spec.name for spec in specs}
    assert {"isft", "idpo", "isft-dpo"} <= names, f"the built-in trainers did not register (got {names})"
    roots += [spec.config_class for spec in specs if spec.config_class is not None]
    seen: set[type] = set()
    while roots:
        cls = roots.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for hint in typing.get_type_hints(cls).values():
            roots += [t for t in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(t)]
    return {(cls.__module__, cls.__name__) for cls in seen}


def _settings_declared_twice(
    fields: dict[tuple[str, str], dict[str, str]], tree: set[tuple[str, str]]
) -> list[str]:
    """Each field of a configuration dataclass outside the configuration tree that re-declares a
    setting of the tree: the same field name, or (a renamed copy) a near-identical docstring.

    Two sections of the tree (``sft.epochs``, ``dpo.epochs``) are two settings a run sets apart,
    not one declared twice; a class outside the tree that mirrors a tree field is a second home
    whose defaults and checks drift from the first.
    """
    leaves = [(cls, name, doc) for cls in sorted(tree & set(fields)) for name, doc in fields[cls].items()]
    found = []
    for cls in sorted(set(fields) - tree):
        if not cls[1].endswith(_CONFIG_SUFFIXES):
            continue
        for name, doc in fields[cls].items():
            for home, other, other_doc in leaves:
                similar = (
                    doc and other_doc and difflib.SequenceMatcher(None, doc, other_doc).ratio() >= _SAME_DOC
                )
                if name == other or similar:
                    found.append(f"{cls[1]}.{name} ({cls[0]}) re-declares {home[1]}.{other} ({home[0]})")
    return found


def test_the_duplicate_finder_sees_a_renamed_copy() -> None:
    tree_source = (
        "@dataclass\nclass TreeConfig:\n    rollouts: int = 3\n"
        '    """Conversations played from each selected node."""\n'
    )
    copy_source = (
        "@dataclass(frozen=True)\nclass MirrorConfig:\n    rollouts_per_node: int = 2\n"
        '    """Conversations played from each selected node"""\n    unrelated: int = 1\n    """Other."""\n'
    )
    fields = _dataclass_fields({"a": tree_source, "b": copy_source})
    assert fields[("b", "MirrorConfig")]["unrelated"] == "Other."
    assert _settings_declared_twice(fields, {("a", "TreeConfig")}) == [
        "MirrorConfig.rollouts_per_node (b) re-declares TreeConfig.rollouts (a)"
    ]
    assert _settings_declared_twice(fields, {("a", "TreeConfig"), ("b", "MirrorConfig")}) == []


def test_no_configuration_setting_is_declared_twice() -> None:
    """A setting of the run (a leaf of ``TrainConfig``'s tree or of a trainer's options) has one
    declaration: no other configuration dataclass of optima_env / optima_trainers copies it."""
    env_and_trainers = ("optima_env", "optima_trainers")
    modules = {n: p for n, p in package_modules().items() if n.split(".")[0] in env_and_trainers}
    fields = _dataclass_fields({n: p.read_text(encoding="utf-8") for n, p in modules.items()})
    tree = _configuration_tree()
    assert ("optima_trainers.config.train", "TrainConfig") in tree
    unread = {c for c in tree - set(fields) if c[0].startswith(("optima_env.", "optima_trainers."))}
    assert not unread, f"sections of the configuration whose source was not read: {unread}"
    duplicates = _settings_declared_twice(fields, tree)
    assert not duplicates, "\n".join(duplicates)
