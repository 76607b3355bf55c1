"""The Layout section of the development page and the package docstrings map every module."""

from __future__ import annotations

import ast
import re

import pytest

from tests.docs import DOCS, section
from tests.helpers import REPO_ROOT

PACKAGES = ("optima_env", "optima_trainers", "benchmarks")


def layout_block() -> str:
    return section(DOCS / "development.md", "Layout").split("```", 2)[1]


def modules(package: str) -> list[str]:
    return sorted(
        str(p.relative_to(REPO_ROOT))
        for p in (REPO_ROOT / package).rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    )


def test_the_layout_names_every_module_and_every_folder() -> None:
    block = layout_block()
    words = set(re.findall(r"[\w.]+\.py|[\w]+/", block))
    missing = [m for m in (m for pkg in PACKAGES for m in modules(pkg)) if m.rsplit("/", 1)[1] not in words]
    assert not missing, f"modules the Layout (docs/development.md) does not name: {missing}"
    folders = {p.parent.name + "/" for pkg in PACKAGES for p in (REPO_ROOT / pkg).rglob("__init__.py")}
    left = sorted(folders - words)
    assert not left, f"packages the Layout (docs/development.md) does not name: {left}"


@pytest.mark.parametrize(
    "package",
    sorted(
        str(p.parent.relative_to(REPO_ROOT))
        for pkg in ("optima_trainers", "benchmarks")
        for p in (REPO_ROOT / pkg).rglob("__init__.py")
        if p.parent != REPO_ROOT / pkg and "integrations" not in p.parts
    ),
)
def test_each_subpackage_docstring_maps_its_modules(package: str) -> None:
    folder = REPO_ROOT / package
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
    dotted = package.replace("/", ".")
    missing = [
        p.stem
        for p in sorted(folder.glob("*.py"))
        if p.name != "__init__.py" and f"{dotted}.{p.stem}" not in doc
    ]
    assert not missing, f"{dotted}'s docstring does not name: {missing}"
