"""Recipes: a trainer's per-task hyperparameters are :class:`~optima_env.specs.Recipe` records
registered through ``optima_register_recipes`` by a task plugin or a trainer plugin, not a
mapping inside the task's spec keyed by trainer names; every task x trainer x preset x profile
resolves as it did when recipes lived in the spec (``recipes_before.json``)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from optima_env import Recipe, TaskSpec, TrainerSpec, get_plugin_manager, hookimpl
from optima_env.configtree import apply
from optima_env.errors import PluginError
from optima_env.registry import recipe_specs, task_specs, trainer_specs
from optima_trainers.config.train import TrainConfig, check_options, resolve_config
from tests.helpers import TinyTask
from tests.optima_trainers.config.recipe_capture import expand, resolve_all

FIXTURE = Path(__file__).with_name("recipes_before.json")
CHANGED_SINCE = {"generation.concurrency": None}
"""Values changed on purpose after the capture: every profile now sizes its conversations in
flight from the engine's capacity (its batch slots moved to ``generation.batch_size``, 32 or 64 as
the capture's ``generation.concurrency``; a field the capture does not hold)."""
REMOVED_SINCE = ("generation.compute_type",)
"""Fields removed on purpose after the capture: the CTranslate2 backend's weight type, with that
backend (CHANGELOG.md); no recipe set it."""


def test_every_task_trainer_preset_and_profile_resolves_as_before() -> None:
    """The paper's recipes moved from ``TaskSpec.presets`` to registered recipes: every registered
    task x built-in trainer x preset x profile gives the configuration captured before the move.

    Every leaf of the fixture is compared (a renamed or removed field fails); a field added to
    ``TrainConfig`` after the capture is not in it, and no recipe of the capture could set it."""
    before = expand(json.loads(FIXTURE.read_text(encoding="utf-8")))
    now = resolve_all()
    # a task registered after the capture: synth-v1 carries synth-v0's recipes
    added = {case: config for case, config in now.items() if case.startswith("ie/synth-v1 ")}
    now = {case: config for case, config in now.items() if case not in added}
    assert sorted(now) == sorted(before) and added
    for case, config in added.items():
        twin = now[case.replace("ie/synth-v1 ", "ie/synth-v0 ")]
        same = {k: v for k, v in config.items() if k != "task"}
        assert same == {k: v for k, v in twin.items() if k != "task"}
    missing = "(no such field now)"
    changed = {}
    for case, old in before.items():
        assert not set(REMOVED_SINCE) & set(now[case]), case
        old = {k: v for k, v in old.items() if k not in REMOVED_SINCE}
        old = {**old, **{k: v for k, v in CHANGED_SINCE.items() if k in old}}
        diff = {k: (v, now[case].get(k, missing)) for k, v in old.items() if now[case].get(k, missing) != v}
        if diff:
            changed[case] = diff
    assert not changed, changed
    for case, old in before.items():  # the captured batch size is the engine's batch slots now
        assert now[case]["generation.batch_size"] == old["generation.concurrency"], case
    # the fixture holds the recipes (the check would pass vacuously if no recipe were applied)
    assert before["ie/hotpotqa-v0 isft-dpo paper cpu"]["dpo.beta"] == 0.5
    assert before["ie/hotpotqa-v0 isft-dpo code cpu"]["dpo.beta"] == 0.1


def _recipe_layer(below: TrainConfig, trainer: TrainerSpec, values: dict[str, Any]) -> TrainConfig:
    """``below`` with a recipe's values applied as ``resolve_config`` applies them (``options.*``
    through the backend's ``config_class``)."""
    plain = {k: v for k, v in values.items() if not k.startswith("options.")}
    options = {k[len("options.") :]: v for k, v in values.items() if k.startswith("options.")}
    return check_options(apply(below, plain), trainer, options)


def test_recipes_state_only_settings_that_differ_from_the_defaults() -> None:
    """No registered recipe (every plugin of the ``optima`` entry-point group, and the template
    plugin) sets a field to the value it would have without that entry.

    That value is the one of the layers under the recipe in ``resolve_config``
    (:mod:`optima_trainers.config.train`): the field defaults with the trainer's own
    ``TrainerSpec.defaults`` on top (layers 1-2) for a ``code`` recipe, and those with the task's
    ``code`` recipe on top for a ``paper`` recipe (applied after it). An entry is a restated
    default when the recipe's layer gives the same configuration with and without it (so an entry
    that undoes a value the same recipe spreads from a shared table counts too). Later layers (the
    task's reward thresholds, presets, profile, overrides) do not count: they apply either way."""
    import optima_task_template

    pm = get_plugin_manager()
    pm.register(optima_task_template, name="template")
    recipes, trainers = recipe_specs(pm), trainer_specs(pm)
    assert {"synth", "hotpotqa", "template"} <= {pm.get_name(p) for p in pm.get_plugins()}
    restated = []
    for (task, name, preset), recipe in recipes.items():
        trainer = trainers[name]
        below = _recipe_layer(TrainConfig(task=task, trainer=name), trainer, dict(trainer.defaults))
        if preset == "paper" and (task, name, "code") in recipes:
            below = _recipe_layer(below, trainer, recipes[(task, name, "code")].values)
        for key, value in recipe.values.items():
            without = {k: v for k, v in recipe.values.items() if k != key}
            if _recipe_layer(below, trainer, without) == _recipe_layer(below, trainer, recipe.values):
                restated.append(f"{recipe}: {key}={value!r}")
    assert len(recipes) > 20  # every built-in task's recipes were read
    assert not restated, "recipe entries that restate the default:\n" + "\n".join(restated)


class AcmeTaskPlugin:
    @hookimpl
    def optima_register_tasks(self):
        return [TaskSpec(id="acme/tiny-v0", factory=TinyTask, family="information_exchange")]

    @hookimpl
    def optima_register_recipes(self):
        return Recipe.table(
            "acme/tiny-v0",
            {
                "code": {"isft": {"selection.theta": 0.25, "iterations": 3}},
                "paper": {"isft": {"iterations": 5}},
            },
        )


def test_hook_optima_register_recipes() -> None:
    pm = get_plugin_manager()
    assert ("ie/synth-v0", "idpo", "code") in recipe_specs(pm)  # the built-in tasks' recipes
    pm.register(AcmeTaskPlugin(), name="acme")
    recipes = recipe_specs(pm)
    assert recipes[("acme/tiny-v0", "isft", "code")].values == {"selection.theta": 0.25, "iterations": 3}
    spec, isft = task_specs(pm)["acme/tiny-v0"], trainer_specs(pm)["isft"]
    code = resolve_config(spec, isft, pm=pm, profile="paper")
    assert (code.selection.theta, code.iterations) == (0.25, 3)
    paper = resolve_config("acme/tiny-v0", "isft", pm=pm, preset="paper", profile="paper")
    assert (paper.selection.theta, paper.iterations) == (0.25, 5)  # the paper's on top of the code's


def test_the_same_recipe_from_two_plugins_is_an_error_naming_both() -> None:
    class Copycat:
        @hookimpl
        def optima_register_recipes(self):
            return [Recipe(task="ie/synth-v0", trainer="isft", values={"selection.theta": 0.0})]

    pm = get_plugin_manager()
    pm.register(Copycat(), name="copycat")
    with pytest.raises(PluginError) as info:
        recipe_specs(pm)
    message = str(info.value)
    assert "recipe (ie/synth-v0, isft, code) is registered twice" in message
    assert "'synth'" in message and "'copycat'" in message

    class Wrong:
        @hookimpl
        def optima_register_recipes(self):
            return [{"task": "ie/synth-v0"}]

    pm = get_plugin_manager()
    pm.register(Wrong(), name="wrong")
    expected = r"plugin 'wrong': optima_register_recipes\(\) must return Recipe records, got dict"
    with pytest.raises(PluginError, match=expected):
        recipe_specs(pm)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"task": "no spaces allowed", "trainer": "isft", "values": {}}, "is not a task id"),
        ({"task": "ie/synth-v0", "trainer": "ISFT", "values": {}}, "is not a trainer name"),
        ({"task": "ie/synth-v0", "trainer": "isft", "values": {}, "preset": "fast"}, "got 'fast'"),
        ({"task": "ie/synth-v0", "trainer": "isft", "values": [("iterations", 2)]}, "must map dotted"),
    ],
)
def test_a_malformed_recipe_is_refused(fields: dict, message: str) -> None:
    with pytest.raises(PluginError, match=message):
        Recipe(**fields)


def test_a_task_spec_no_longer_takes_presets() -> None:
    """The task declares only what is about the task; the old field fails saying what to do."""
    with pytest.raises(PluginError, match=r"TaskSpec\.presets was removed.*optima_register_recipes"):
        TaskSpec(id="acme/old-v0", factory=TinyTask, family="debate", presets={"code": {"isft": {}}})
    assert "presets" not in {f.name for f in dataclasses.fields(TaskSpec)}


def test_a_recipe_copies_its_values() -> None:
    table = {"code": {"isft": {"iterations": 2}}}
    (recipe,) = Recipe.table("acme/tiny-v0", table)
    table["code"]["isft"]["iterations"] = 9
    assert recipe.values == {"iterations": 2} and recipe.key == ("acme/tiny-v0", "isft", "code")


class AcmeTrainerPlugin:
    """A third-party trainer that brings its own recipe for a built-in task (no task names it)."""

    @hookimpl
    def optima_register_trainers(self):
        return [TrainerSpec(name="acme-rft", factory=lambda config: None)]

    @hookimpl
    def optima_register_recipes(self):
        return [
            Recipe(task="ie/synth-v0", trainer="acme-rft", values={"generation.temperature": 1.1}),
            Recipe(task="ie/synth-v0", trainer="acme-rft", preset="paper", values={"iterations": 7}),
        ]


def test_a_third_party_trainer_brings_its_own_recipe(caplog: pytest.LogCaptureFixture) -> None:
    pm = get_plugin_manager()
    pm.register(AcmeTrainerPlugin(), name="acme-trainer")
    with caplog.at_level(logging.WARNING):
        code = resolve_config("ie/synth-v0", "acme-rft", pm=pm)
        paper = resolve_config("ie/synth-v0", "acme-rft", pm=pm, preset="paper", profile="paper")
    assert "has no 'code' preset" not in caplog.text
    assert code.generation.temperature == 1.1 and paper.generation.temperature == 1.1
    assert paper.iterations == 7
    # the synth plugin's recipes stay with the built-in trainers; only the trainer's own applies
    generic, isft = (resolve_config("ie/synth-v0", t).selection.theta for t in ("grpo", "isft"))
    assert code.selection.theta == generic != isft
    with caplog.at_level(logging.WARNING):
        other = resolve_config("ie/hotpotqa-v0", "acme-rft", pm=pm)  # no recipe for that task
    assert "task 'ie/hotpotqa-v0' has no 'code' preset for trainer 'acme-rft'" in caplog.text
    assert "'acme-rft' has recipes for ie/synth-v0" in caplog.text  # where a misspelt id would show
    assert other.generation.temperature == resolve_config("ie/hotpotqa-v0", "grpo").generation.temperature


@pytest.mark.slow
def test_the_rft_example_applies_its_own_recipe_from_the_cli(tmp_path: Path) -> None:
    """The example trainer package (installed through its entry point) carries a recipe for
    ``ie/synth-v0``; ``--print-config`` shows it applied, and ``--set`` still wins over it."""
    from tests.optima_trainers.backends.test_third_party_trainer import _cli, _install

    env = _install(tmp_path / "site")
    done = _cli(env, "--trainer", "rft", "--task", "ie/synth-v0", "--print-config")
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads(done.stdout)
    assert config["generation"]["temperature"] == 1.0 and config["options"]["per_instance"] == 2
    assert "has no 'code' preset" not in done.stderr
    given = _cli(env, "--trainer", "rft", "--task", "ie/synth-v0", "--set", "options.per_instance=3",
                 "--print-config")  # fmt: skip
    assert json.loads(given.stdout)["options"]["per_instance"] == 3


def test_the_readme_recipe_example_runs(tmp_path: Path) -> None:
    """The README's recipe snippet ("Writing a task plugin"), appended to that section's plugin,
    registers a recipe the trainers apply."""
    import importlib.util
    import re

    from tests.helpers import REPO_ROOT

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Writing a task plugin\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    plugin, (snippet,) = blocks[0], [b for b in blocks if "def optima_register_recipes" in b]
    path = tmp_path / "optima_task_readme_recipe.py"
    path.write_text(plugin + "\n\n" + snippet, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pm = get_plugin_manager()
    pm.register(module, name="readme-recipe")
    config = resolve_config("riddles/mira-v0", "isft", pm=pm, profile="paper")
    assert (config.selection.theta, config.generation.num_samples, config.iterations) == (0.3, 8, 4)
