"""Plugin discovery through entry points, and the registry's errors."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from optima_env import PluginError, TaskSpec, UnknownTaskError, get_plugin_manager, hookimpl, list_tasks, make
from optima_env.registry import resolve_task_id, task_specs
from tests.helpers import TinyTask


def test_builtin_tasks_come_from_the_optima_entry_point_group() -> None:
    entry_points = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="optima")}
    assert entry_points.get("synth") == "optima_task_synth"
    pm = get_plugin_manager()
    assert pm.get_plugin("synth") is not None  # registered under its entry-point name
    assert "ie/synth-v0" in list_tasks(pm)


def test_autoload_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert list_tasks(get_plugin_manager(autoload=False)) == []
    monkeypatch.setenv("OPTIMA_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert list_tasks(get_plugin_manager()) == []


def test_third_party_plugin_registers_like_a_builtin(tiny_pm) -> None:
    assert list_tasks(tiny_pm) == ["test/tiny-v0"]
    env = make("test/tiny-v0", pm=tiny_pm)
    assert isinstance(env.task, TinyTask) and env.task.id == "test/tiny-v0"


def test_duplicate_task_id_names_both_plugins(tiny_pm) -> None:
    class Clash:
        @hookimpl
        def optima_register_tasks(self):
            return [TaskSpec(id="test/tiny-v0", factory=TinyTask, family="information_exchange")]

    tiny_pm.register(Clash(), name="clash")
    with pytest.raises(
        PluginError, match=r"registered twice.*'tiny-task'.*'clash'|registered twice.*'clash'.*'tiny-task'"
    ):
        task_specs(tiny_pm)


def test_unknown_task_lists_what_is_registered(tiny_pm) -> None:
    with pytest.raises(UnknownTaskError, match=r"no task 'nope'; registered: test/tiny-v0"):
        make("nope", pm=tiny_pm)


def test_ids_resolve_without_version_and_by_bare_name(tiny_pm) -> None:
    class V1:
        @hookimpl
        def optima_register_tasks(self):
            return [TaskSpec(id="test/tiny-v1", factory=TinyTask, family="information_exchange")]

    tiny_pm.register(V1(), name="v1")
    assert resolve_task_id("test/tiny", tiny_pm) == "test/tiny-v1"
    assert resolve_task_id("tiny", tiny_pm) == "test/tiny-v1"
    assert resolve_task_id("test/tiny-v0", tiny_pm) == "test/tiny-v0"


def test_bad_hook_return_and_bad_ids_raise_plugin_error(tiny_pm) -> None:
    class Bad:
        @hookimpl
        def optima_register_tasks(self):
            return TaskSpec(id="test/x-v0", factory=TinyTask, family="debate")

    tiny_pm.register(Bad(), name="bad")
    with pytest.raises(PluginError, match="must return a list"):
        task_specs(tiny_pm)
    with pytest.raises(PluginError, match="namespace/name-vN"):
        TaskSpec(id="has space", factory=TinyTask, family="debate")


def test_unknown_hook_implementation_is_rejected() -> None:
    pm = get_plugin_manager(autoload=False)

    class Typo:
        @hookimpl
        def optima_register_taks(self):
            return []

    pm.register(Typo())
    with pytest.raises(Exception, match="unknown hook"):
        pm.check_pending()


def test_importing_optima_env_does_not_import_torch() -> None:
    code = (
        "import sys, optima_env, optima_env.rollout, optima_env.models, optima_env.readability; "
        "optima_env.make('ie/synth-v0'); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
