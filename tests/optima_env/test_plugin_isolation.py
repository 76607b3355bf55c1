"""A broken third-party plugin is skipped with one warning; OPTIMA_STRICT_PLUGINS=1 makes it an error.

Each test installs a real distribution into a temporary folder on ``sys.path``: a ``.dist-info``
with an ``entry_points.txt`` in the ``optima`` group, pointing at a module that fails to import,
or at one that imports but cannot be registered (a hook with a typo, a hook with wrong arguments).
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from optima_env import PluginError, get_plugin_manager, list_tasks, registry

BROKEN_IMPORT = "raise ImportError('the plugin needs libfoo, which is not installed')\n"
TYPO_HOOK = """
from optima_env import hookimpl

@hookimpl
def optima_register_taskz():
    return []
"""
WRONG_ARGUMENTS = """
from optima_env import hookimpl

@hookimpl
def optima_register_tasks(unexpected_argument):
    return []
"""


def install_plugin(root: Path, monkeypatch: pytest.MonkeyPatch, *, name: str, source: str) -> str:
    """Install distribution ``optima-test-<name>`` with entry point ``<name> = <module>``."""
    module = f"optima_test_plugin_{name}"
    (root / f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    dist_info = root / f"optima_test_{name}-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: optima-test-{name}\nVersion: 0.1\n", encoding="utf-8"
    )
    (dist_info / "entry_points.txt").write_text(f"[optima]\n{name} = {module}\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv("OPTIMA_STRICT_PLUGINS", raising=False)
    monkeypatch.delenv("OPTIMA_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setattr(registry, "_WARNED_ENTRY_POINTS", set())
    return f"{name} = {module}"


def plugin_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "optima plugin entry point" in r.getMessage()]


@pytest.mark.parametrize(
    "name, source, error",
    [
        ("brokenimport", BROKEN_IMPORT, "ImportError: the plugin needs libfoo"),
        ("typohook", TYPO_HOOK, "unknown hook 'optima_register_taskz'"),
        ("wrongargs", WRONG_ARGUMENTS, "unexpected_argument"),
    ],
)
def test_a_broken_plugin_is_skipped_with_one_warning(tmp_path, monkeypatch, caplog, name, source, error):
    where = install_plugin(tmp_path, monkeypatch, name=name, source=source)
    with caplog.at_level(logging.WARNING, logger="optima_env.registry"):
        pm = get_plugin_manager()
        get_plugin_manager()  # every command builds managers again: still one warning
    messages = plugin_warnings(caplog)
    assert len(messages) == 1, messages
    assert repr(where) in messages[0] and error in messages[0] and "skipping it" in messages[0]
    assert f"optima-test-{name}" in messages[0]  # the distribution to fix or uninstall
    assert not pm.has_plugin(name)
    assert "ie/synth-v0" in list_tasks(pm)  # the other plugins still work


def test_strict_plugins_turns_a_broken_plugin_into_a_plugin_error(tmp_path, monkeypatch) -> None:
    where = install_plugin(tmp_path, monkeypatch, name="strictbroken", source=BROKEN_IMPORT)
    monkeypatch.setenv("OPTIMA_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match=rf"{where!r}.*ImportError: the plugin needs libfoo.*STRICT"):
        get_plugin_manager()
    monkeypatch.setenv("OPTIMA_STRICT_PLUGINS", "0")  # "0" means off
    assert not get_plugin_manager().has_plugin("strictbroken")
    with pytest.raises(PluginError, match="libfoo"):
        get_plugin_manager(strict=True)


def test_a_working_third_party_plugin_still_loads(tmp_path, monkeypatch) -> None:
    source = """
    from optima_env import TaskSpec, hookimpl
    from tests.helpers import TinyTask

    @hookimpl
    def optima_register_tasks():
        return [TaskSpec(id="thirdparty/tiny-v0", factory=TinyTask, family="information_exchange")]
    """
    install_plugin(tmp_path, monkeypatch, name="goodplugin", source=source)
    monkeypatch.setenv("OPTIMA_STRICT_PLUGINS", "1")
    pm = get_plugin_manager()
    assert pm.has_plugin("goodplugin") and "thirdparty/tiny-v0" in list_tasks(pm)
    assert any(name == "goodplugin" for name, _ in pm.list_name_plugin())
