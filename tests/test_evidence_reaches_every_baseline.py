"""A task written exactly as the README's "Writing a task plugin" example: every baseline is shown
its evidence, and the same task with its evidence hidden fails ``check_task`` and the baselines."""

from __future__ import annotations

import importlib.util
import random
import re

import pytest

from benchmarks.evaluation.methods import PlaySettings, build_methods
from optima_env import TaskContractError, get_plugin_manager, make_task
from optima_env.testing import check_task
from tests.helpers import REPO_ROOT

CLUES = ("Mira lives on Lantern Island.", "Lantern Island's only city is Qesh.")


def readme_plugin_code() -> str:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Writing a task plugin\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]


def install(code: str, tmp_path, name: str):
    """Import ``code`` as a plugin module and register it on a fresh plugin manager."""
    path = tmp_path / f"{name}.py"
    path.write_text(code, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pm = get_plugin_manager()
    pm.register(module, name=name)
    return pm


def baseline_prompts(task) -> dict[str, list[str]]:
    """Every agent's system prompt of each baseline, for the task's first test instance."""
    settings = PlaySettings(max_turns=4, max_new_tokens=16)
    methods = build_methods(["cot", "sc", "mad", "autoform"], {}, settings)
    out = {}
    for method in methods:
        played = method.play_task(task)
        sample = played.samples("test")[0]
        views = played.views(sample, rng=random.Random(0))
        out[method.key] = [v.system_prompt for v in views.values()]
    return out


def test_each_baseline_sees_the_readme_tasks_evidence(tmp_path, capsys) -> None:
    code = readme_plugin_code()
    assert all(clue in code for clue in CLUES)  # the evidence this test looks for is the README's
    pm = install(code, tmp_path, "optima_task_readme_evidence")
    check_task("riddles/mira-v0", pm=pm)
    assert capsys.readouterr().out == ""  # a task that passes prints nothing
    prompts = baseline_prompts(make_task("riddles/mira-v0", pm=pm))
    assert sorted(prompts) == ["autoform", "cot", "mad", "sc"]
    for key in ("cot", "sc"):  # one agent that sees every agent's evidence
        (prompt,) = prompts[key]
        assert all(clue in prompt for clue in CLUES), (key, prompt)
    for key in ("mad", "autoform"):  # each agent sees the clue it was dealt
        assert [clue in p for p, clue in zip(prompts[key], CLUES, strict=True)] == [True, True], key


def test_a_task_that_hides_its_evidence_fails_the_checks_and_the_baselines(tmp_path) -> None:
    code = readme_plugin_code().replace(", private=(clue,)", "")
    assert "private=" not in code  # the README example before the evidence was declared
    pm = install(code, tmp_path, "optima_task_readme_hidden")
    with pytest.raises(TaskContractError, match=r"fails check 'evidence'.*declares no evidence"):
        check_task("riddles/mira-v0", pm=pm)
    task = make_task("riddles/mira-v0", pm=pm)
    for method in build_methods(["cot", "mad"], {}, PlaySettings(max_turns=4, max_new_tokens=16)):
        played = method.play_task(task)
        with pytest.raises(TaskContractError, match="declares no evidence"):
            played.views(played.samples("test")[0], rng=random.Random(0))


def test_a_closed_book_task_opts_out_of_the_evidence_check(tmp_path) -> None:
    code = readme_plugin_code().replace(", private=(clue,)", "")
    pm = install(code, tmp_path, "optima_task_readme_closed_book")
    task = make_task("riddles/mira-v0", pm=pm)
    task.deals_evidence = False  # a closed-book variant: its baselines rightly see the question only
    assert "evidence" not in check_task(task, api_cycles=3).checks
    (method,) = build_methods(["cot"], {}, PlaySettings(max_turns=4, max_new_tokens=16))
    played = method.play_task(task)
    (view,) = played.views(played.samples("test")[0], rng=random.Random(0)).values()
    assert view.private == ()
