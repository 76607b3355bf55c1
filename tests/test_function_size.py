"""No function over ~60 lines of body or 8 parameters without a stated reason.

A long function or a long parameter list is where concepts hide (stage functions of 14-16
parameters, 7 of them callables, were found this way). One that has a reason to be so says it in a
comment on the line above its ``def`` (or above its decorators): ``# size: <why>``. The reason is
read here, so it cannot go stale silently: a ``# size:`` comment on a function within the limits
fails too.
"""

from __future__ import annotations

import ast

from tests.helpers import REPO_ROOT

PACKAGES = ("optima_env", "optima_trainers", "benchmarks", "plugins")
MAX_PARAMS = 8
MAX_BODY_LINES = 60
MARKER = "# size:"


def _measure(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int]:
    """(parameters but ``self``/``cls``, body lines after the docstring)."""
    a = node.args
    params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    if a.args and a.args[0].arg in ("self", "cls"):
        params -= 1
    has_doc = ast.get_docstring(node, clean=False) is not None and len(node.body) > 1
    start = node.body[1 if has_doc else 0].lineno
    return params, node.end_lineno - start + 1


def _reason(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    above = lines[first - 2].strip() if first >= 2 else ""
    return above[len(MARKER) :].strip() if above.startswith(MARKER) else None


def oversized(source: str, where: str) -> list[str]:
    """Every oversized function without a reason, and every reason on a function within limits."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params, body = _measure(node)
        reason = _reason(lines, node)
        big = params > MAX_PARAMS or body > MAX_BODY_LINES
        if big and not reason:
            found.append(f"{where}:{node.lineno} {node.name}: {params} parameters, {body} body lines")
        elif reason and not big:
            found.append(f"{where}:{node.lineno} {node.name}: within limits, drop its stale '{MARKER}' comment")
    return found


def test_the_size_check_sees_parameters_length_and_reasons() -> None:
    params = ", ".join(f"a{i}" for i in range(9))
    many = f"def f({params}):\n    return 1\n"
    long = "def g(x):\n    '''Doc.'''\n" + "    x += 1\n" * 61 + "    return x\n"
    assert oversized(many, "m") == ["m:1 f: 9 parameters, 1 body lines"]
    assert oversized(long, "m") == ["m:1 g: 1 parameters, 62 body lines"]
    assert oversized("# size: mirrors the library's constructor\n" + many, "m") == []
    assert oversized("# size: stale\ndef h(self, a):\n    return a\n", "m")[0].endswith("stale '# size:' comment")
    method = "class C:\n    # size: reason\n    @staticmethod\n    def f(" + params + "):\n        return 1\n"
    assert oversized(method, "m") == []


def test_no_function_is_oversized_without_a_stated_reason() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            found += oversized(path.read_text(encoding="utf-8"), str(path.relative_to(REPO_ROOT)))
    assert not found, "\n".join(found)
