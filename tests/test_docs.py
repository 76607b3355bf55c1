"""The documentation: the README stays a landing page, the site (``mkdocs.yml``, ``docs/``) builds
with warnings as errors, and what the pages show is real: their Python parses and imports the
public surface, the commands and test files they name exist, the README's links resolve, and the
snippets that need no model run (those that do: ``tests/test_doc_snippets.py``)."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import types

import pytest

from optima_env import get_plugin_manager
from optima_trainers import resolve_config
from tests.docs import DOCS, README, code_block, code_blocks, pages, section, text
from tests.helpers import REPO_ROOT
from tests.test_public_api import INTEGRATION, PACKAGES, imported_names, unreachable

README_MAX_LINES = 230
"""The landing page's budget, outside its generated demo block (about 25 lines, rewritten by the
demo): what it is, the two commands, the quick start, the headline table, links; the rest lives
in ``docs/``."""


def name(path) -> str:
    return str(path.relative_to(REPO_ROOT))


def test_the_site_builds_with_warnings_as_errors(tmp_path) -> None:
    """``mkdocs build --strict``: a broken link or anchor, a page missing from the navigation, a
    README section a page includes that is gone, or a docstring the API reference cannot render
    fails the build; and every public name has its entry in the API reference."""
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]  # (--quiet would hide them from --strict)
    assert "RiddleTask" in (site / "guides" / "tasks" / "index.html").read_text(encoding="utf-8")
    assert undocumented(site) == []


PUBLIC = {
    "optima_env": ("optima_env/__init__.py", "optima_env/integrations/verifiers.py"),
    "optima_trainers": ("optima_trainers/__init__.py", "optima_trainers/integrations/trl.py"),
}
"""Each API reference page and the modules whose ``__all__`` it documents."""


def undocumented(site) -> list[str]:
    """The public names (each ``__all__`` of :data:`PUBLIC`) that have no entry on their API
    reference page of the built ``site`` (an entry's anchor is its dotted path)."""
    missing = []
    for page, modules in PUBLIC.items():
        html = (site / "reference" / page / "index.html").read_text(encoding="utf-8")
        anchors = {a.rsplit(".", 1)[-1] for a in re.findall(r'id="([\w.]+)"', html)}
        for module in modules:
            names = public_names(REPO_ROOT / module)
            assert names, f"{module} has no __all__"
            missing += [f"{module}: {n}" for n in names if not n.startswith("_") and n not in anchors]
    return missing


def public_names(path) -> list[str]:
    for node in ast.parse(text(path)).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def test_the_readme_is_a_landing_page_whose_links_resolve() -> None:
    lines = text(README).splitlines()
    for marker in ("<!-- ci:main-command -->", "<!-- ci:test-command -->", "<!-- begin demo -->"):
        assert marker in lines, marker
    generated = lines.index("<!-- end demo -->") - lines.index("<!-- begin demo -->") + 1
    written = len(lines) - generated
    assert written <= README_MAX_LINES, (
        f"README.md has {written} lines besides its demo block; move sections to docs/"
    )
    targets = re.findall(r"\]\(((?!https?:|#)[^)#\s]+)(?:#[^)]*)?\)", text(README))
    assert any(t.startswith("docs/") for t in targets), targets
    missing = sorted({t for t in targets if not (REPO_ROOT / t).exists()})
    assert not missing, f"README links to files that do not exist: {missing}"


def python_blocks() -> list[tuple[str, str]]:
    return [(name(page), block) for page in pages() for block in code_blocks(text(page), "python")]


def test_every_python_block_parses_and_imports_only_the_public_surface() -> None:
    """The rule ``tests/test_public_api.py`` holds the README to, on every page: a name comes from
    a package's top level (or an ``integrations`` module) and is in its ``__all__``."""
    blocks = python_blocks()
    assert len({page for page, _ in blocks}) >= 4, blocks  # the README and the guides were found
    imports = []
    for page, block in blocks:
        try:
            imports += [(page, pair) for pair in imported_names(block)]
        except SyntaxError as exc:
            pytest.fail(f"{page}: a python block does not parse: {exc}")
    deep = sorted(
        {
            f"{page}: from {m} import {n}"
            for page, (m, n) in imports
            if m not in PACKAGES and not INTEGRATION.match(m)
        }
    )
    assert deep == [], f"pages import from deep modules; import from the package: {deep}"
    assert unreachable([pair for _, pair in imports]) == []


COMMAND = re.compile(r"python -m ((?:optima_env|optima_trainers|benchmarks)(?:\.\w+)+)")


def test_every_command_the_pages_name_is_a_module_that_runs_as_a_script() -> None:
    commands = {c for page in pages() for c in COMMAND.findall(text(page))}
    assert {"benchmarks.run", "optima_trainers.train", "optima_env.check"} <= commands, commands
    missing = sorted(c for c in commands if importlib.util.find_spec(c) is None)
    assert not missing, f"`python -m` commands the documentation names that do not exist: {missing}"
    for command in sorted(commands):
        with open(importlib.util.find_spec(command).origin, encoding="utf-8") as handle:
            source = handle.read()
        assert 'if __name__ == "__main__":' in source, f"`python -m {command}` runs nothing"


def test_every_test_file_the_pages_name_exists() -> None:
    named = {(name(page), p) for page in pages() for p in re.findall(r"\btests/[\w/]+\.py\b", text(page))}
    missing = sorted(f"{page}: {path}" for page, path in named if not (REPO_ROOT / path).is_file())
    assert not missing, f"test files the documentation names that do not exist: {missing}"


def test_the_readme_training_snippet_resolves_the_configuration_it_shows() -> None:
    code = code_block(README, "Train", "resolve_config(")
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    iterations, lambda_token, rpo_alpha = proc.stdout.split()
    assert (int(iterations) >= 1, float(lambda_token), float(rpo_alpha)) == (True, 0.4, 1.0)


def module_from(code: str, name: str) -> types.ModuleType:
    """``code`` executed as the module ``name`` (a plugin module, as its package would import it;
    compiled as written, without this file's ``from __future__`` flags)."""
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(code, f"<{name}>", "exec", dont_inherit=True), module.__dict__)
    return module


def test_the_reward_snippet_prints_eq_1_and_the_paper_preset(capsys) -> None:
    module_from(code_block(DOCS / "reward.md", "The Optima reward", "optima_reward("), "reward_doc")
    eq1, paper = capsys.readouterr().out.splitlines()
    assert float(eq1) == pytest.approx(1.2) and "short_trajectory_tokens=None" in paper


def test_the_task_guides_reward_thresholds_build_a_spec_for_the_readme_task() -> None:
    plugin = code_blocks(section(README, "Writing a task plugin"), "python")[0]
    thresholds = code_block(DOCS / "guides" / "tasks.md", "Writing a task plugin", "reward=")
    assert thresholds.count("TaskSpec(") == 1
    module = module_from(plugin + "\n\nspec = " + thresholds, "optima_task_riddles_doc")
    assert module.spec.reward == {"short_trajectory_tokens": 8, "repeated_turn_zero_loss": False}
    assert module.spec.factory is module.RiddleTask


def test_the_trainer_backend_example_registers_and_resolves() -> None:
    """The trainers guide's complete backend (the runnable package is ``examples/optima_trainer_rft``,
    trained in ``tests/optima_trainers/backends/test_third_party_trainer.py``)."""
    code = code_block(DOCS / "guides" / "trainers.md", "Writing a trainer backend", "class RFTBackend")
    pm = get_plugin_manager()
    pm.register(module_from(code, "optima_trainer_rft_doc"), name="rft-doc")
    config = resolve_config("ie/synth-v0", "rft", pm=pm, overrides={"options.min_task_score": 0.5})
    assert (config.trainer, config.options) == ("rft", {"min_task_score": 0.5, "per_instance": 1})
