"""The template plugin and the README's "Writing a task plugin" example both pass the checks."""

from __future__ import annotations

import importlib.util
import random
import re

import optima_task_template
import pytest

from optima_env import TaskContractError, get_plugin_manager, list_tasks, make
from optima_env.policy import ScriptedPolicy
from optima_env.rollout import run_episode
from optima_env.testing import check_task
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(probably should be gymnasium|recommend agents to be named).*:UserWarning"
)


def readme_section(title: str) -> str:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_example_is_a_working_plugin(tmp_path) -> None:
    code = re.findall(r"```python\n(.*?)```", readme_section("Writing a task plugin"), re.DOTALL)[0]
    assert 30 <= len(code.strip().splitlines()) <= 50  # "a new task in about 40 lines"
    path = tmp_path / "optima_task_readme_riddles.py"
    path.write_text(code, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # import the example like any plugin module
    pm = get_plugin_manager()
    pm.register(module, name="riddles")
    report = check_task("riddles/mira-v0", pm=pm)
    assert report.task_id == "riddles/mira-v0"
    env = make("mira", pm=pm)
    episode = run_episode(env, ScriptedPolicy(lambda r: "<A>Qesh</A>"), seed=0)
    assert episode.terminated and episode.task_score == 1.0


def test_template_plays_with_two_and_three_agents() -> None:
    pm = get_plugin_manager()
    pm.register(optima_task_template, name="template")
    assert "example/template-v0" in list_tasks(pm)
    env = make("example/template-v0", pm=pm, split="train", num_agents=3)
    views = env.task.views(env.task.samples("train")[0], rng=random.Random(0))
    assert views["Alice"].private == ("Mira Tol lives on Lantern Island.",)
    assert views["Charlie"].private == ()
    check_task(env.task, split="train", api_cycles=5)
    with pytest.raises(TaskContractError, match="unknown split"):
        env.task.samples("dev")


def test_the_template_sets_its_own_recipes_and_reward_thresholds() -> None:
    """A task plugin registers its trainer recipes and its spec its reward thresholds; the trainers
    apply both."""
    from optima_env import get_plugin_manager
    from optima_env.registry import task_specs, trainer_specs
    from optima_trainers.config.train import resolve_config

    pm = get_plugin_manager()
    pm.register(optima_task_template, name="template")
    spec, trainers = task_specs(pm)["example/template-v0"], trainer_specs(pm)
    isft = resolve_config(spec, trainers["isft"], profile="paper", pm=pm)
    assert (isft.selection.theta, isft.generation.num_samples, isft.iterations) == (0.3, 8, 4)
    assert isft.reward.short_trajectory_tokens == 6 and not isft.reward.repeated_turn_zero_loss
    idpo = resolve_config(spec, trainers["idpo"], profile="paper", pm=pm)
    assert idpo.tree.theta_filter == 0.3 and idpo.tree_reward.short_trajectory_tokens == 6
