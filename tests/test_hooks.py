"""Every hookspec has a test (datasette's meta-test), and the tests of the registration and env hooks.

The trainer hooks' tests (``test_hook_optima_episode_scored`` and the others) run a real training
run in ``tests/optima_trainers/host/test_loop.py``; the meta-test finds them by name anywhere under
``tests/``.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from optima_env import TaskSpec, get_plugin_manager, hookimpl, hookspecs, make
from optima_env.configtree import ConfigError
from optima_env.errors import PluginError
from optima_env.registry import readability_specs, task_specs, trainer_specs
from optima_env.specs import ReadabilitySpec, TrainerSpec
from tests.helpers import TinyTask

TESTS = Path(__file__).resolve().parent


def _hook_names() -> list[str]:
    """Every hookspec: the env's and the trainers' (the training events the trainer host adds)."""
    from optima_trainers import hookspecs as trainer_hookspecs

    return sorted(
        name
        for module in (hookspecs, trainer_hookspecs)
        for name, obj in inspect.getmembers(module, inspect.isfunction)
        if name.startswith("optima_") and hasattr(obj, "optima_spec")
    )


def _test_names() -> set[str]:
    names: set[str] = set()
    for path in TESTS.rglob("test_*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names |= {
            n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
        }
    return names


def test_every_hookspec_has_a_test() -> None:
    hooks = _hook_names()
    assert len(hooks) >= 11, hooks  # the spec marker is found (else the check would pass vacuously)
    tests = _test_names()
    missing = [h for h in hooks if f"test_hook_{h}" not in tests]
    assert not missing, f"hookspecs without a test_hook_<name> test: {missing}"


def test_every_hookspec_is_documented_in_the_readme() -> None:
    readme = (TESTS.parent / "README.md").read_text(encoding="utf-8")
    missing = [h for h in _hook_names() if f"`{h}`" not in readme]
    assert not missing, f"hookspecs the README does not name: {missing}"


class TaskPlugin:
    @hookimpl
    def optima_register_tasks(self):
        return [TaskSpec(id="acme/tiny-v0", factory=TinyTask, family="information_exchange")]


def test_hook_optima_register_tasks() -> None:
    pm = get_plugin_manager()
    pm.register(TaskPlugin())
    specs = task_specs(pm)
    assert specs["acme/tiny-v0"].factory is TinyTask and "ie/synth-v0" in specs


def test_hook_optima_register_trainers() -> None:
    class Plugin:
        @hookimpl
        def optima_register_trainers(self):
            return [TrainerSpec(name="acme-trainer", factory=lambda config: None, description="x")]

    pm = get_plugin_manager()
    pm.register(Plugin())
    specs = trainer_specs(pm)
    assert {"isft", "idpo", "isft-dpo", "acme-trainer"} <= set(specs)
    with pytest.raises(PluginError, match="trainer name 'Bad Name'"):
        TrainerSpec(name="Bad Name", factory=lambda config: None)


def test_hook_optima_register_readability_scorers() -> None:
    """The built-in scorer comes through the hook (entry point ``readability``); a plugin adds one,
    and the trainer loads whichever its ``readability_scorer`` names."""

    def constant(model, **kwargs):
        return lambda texts: [2.0 for _ in texts]

    class Plugin:
        @hookimpl
        def optima_register_readability_scorers(self):
            return [ReadabilitySpec(name="constant", factory=constant)]

    pm = get_plugin_manager()
    assert "transformers" in readability_specs(pm)
    pm.register(Plugin())
    specs = readability_specs(pm)
    assert specs["constant"].factory("any-model")(["a", "b"]) == [2.0, 2.0]

    from optima_trainers.config.train import resolve_config
    from optima_trainers.generation.rollouts import load_readability_scorer

    config = resolve_config("ie/synth-v0", "isft", readability_scorer="constant")
    assert load_readability_scorer(config, pm)(["x"]) == [2.0]
    expected = r"readability_scorer: expected one of .*'transformers'.*, got 'nope'"
    with pytest.raises(ConfigError, match=expected):
        load_readability_scorer(config.replace(readability_scorer="nope"), pm)


def test_an_unregistered_readability_scorer_is_refused_when_the_run_is_built(tmp_path) -> None:
    from optima_trainers import IterativeTrainer, RunDir, resolve_config

    config = resolve_config("ie/synth-v0", "isft", profile="cpu", readability_scorer="ct2")  # retired backend
    with pytest.raises(ConfigError, match=r"readability_scorer: expected one of 'transformers'.*, got 'ct2'"):
        IterativeTrainer(config, run_dir=RunDir.create(config, run_dir=tmp_path / "run"), progress=False)


def test_hook_optima_episode_start() -> None:
    starts = []

    class Plugin:
        @hookimpl
        def optima_episode_start(self, task_id, sample_id, seed):
            starts.append((task_id, sample_id, seed))

    pm = get_plugin_manager()
    pm.register(Plugin())
    env = make("ie/synth-v0", pm=pm)
    env.reset(seed=7)
    assert starts == [("ie/synth-v0", env.sample.id, 7)]
