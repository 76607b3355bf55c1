"""Conformance of every registered task (``optima_env.testing.check_task``), and of the checks.

Each registered task runs the full suite: views, the format pool, answer extraction on junk,
scores in [0, 1] with the gold answer scoring 1, seed reproducibility with a scripted policy,
and PettingZoo's ``api_test``, ``seed_test`` and ``parallel_api_test``. Dataset tasks play their
real ``test`` split when ``OPTIMA_DATA_DIR`` holds it, and otherwise fixtures written in the
upstream schemas (TriviaQA and CBT always use fixtures on this machine).
"""

from __future__ import annotations

import doctest
import importlib
import os
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optima_task_template
import pytest

from optima_env import AgentView, DataError, TaskContractError, TaskSample, get_plugin_manager, list_tasks
from optima_env.families import DatasetTask
from optima_env.registry import task_specs
from optima_env.testing import check_task
from tests.helpers import TinyTask, write_task_fixtures

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(probably should be gymnasium|recommend agents to be named).*:UserWarning"
)

PAPER_TASKS = [
    "debate/arc_challenge-v0",
    "debate/gsm8k-v0",
    "debate/math-v0",
    "debate/mmlu-v0",
    "ie/2wikimultihopqa-v0",
    "ie/cbt-v0",
    "ie/hotpotqa-v0",
    "ie/triviaqa-v0",
]


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task_fixtures(tmp_path_factory.mktemp("data"))


def answer_turn(sample: TaskSample) -> str:
    """A turn carrying the gold answer in both answer formats (tagged and boxed)."""
    return f"Alice: so <A>{sample.answer}</A>, i.e. \\boxed{{{sample.answer}}}"


def task_kwargs(task_id: str, fixture_dir: Path) -> dict[str, Any]:
    """Real data when OPTIMA_DATA_DIR has the task's test split, else the fixtures."""
    factory = task_specs()[task_id].factory
    if not (isinstance(factory, type) and issubclass(factory, DatasetTask)):
        return {}
    real = os.environ.get("OPTIMA_DATA_DIR")
    if real:
        try:
            factory(data_dir=real, source="local").samples("test")
            return {"data_dir": real, "source": "local"}
        except DataError:
            pass
    return {"data_dir": fixture_dir, "source": "local"}


def test_the_eight_paper_tasks_and_both_embedded_versions_are_registered() -> None:
    assert list_tasks() == sorted([*PAPER_TASKS, "ie/synth-v0", "ie/synth-v1"])


@pytest.mark.parametrize("task_id", list_tasks())
def test_registered_task_conforms(task_id: str, fixture_dir: Path) -> None:
    kwargs = task_kwargs(task_id, fixture_dir)
    report = check_task(task_id, task_kwargs=kwargs, api_cycles=15)
    assert report.task_id == task_id and report.samples_checked >= 1
    assert "api_test" in report.checks and "episode_seed" in report.checks


@pytest.mark.parametrize("task_id", ["ie/hotpotqa-v0", "ie/2wikimultihopqa-v0", "debate/arc_challenge-v0"])
def test_three_agent_variants_conform(task_id: str, fixture_dir: Path) -> None:
    kwargs = {**task_kwargs(task_id, fixture_dir), "num_agents": 3}
    check_task(task_id, task_kwargs=kwargs, num_samples=2, api_cycles=10)


@pytest.mark.parametrize("task_id", PAPER_TASKS)
def test_a_turn_carrying_the_gold_answer_scores_one(task_id: str, fixture_dir: Path) -> None:
    check_task(task_id, task_kwargs={"data_dir": fixture_dir, "source": "local"}, answer_text=answer_turn)


@pytest.mark.parametrize("task_id", list_tasks())
def test_each_task_module_docstring_is_its_doc_page(task_id: str) -> None:
    doc = sys.modules[task_specs()[task_id].factory.__module__].__doc__ or ""
    assert f"``{task_id}``" in doc
    for row in ("agents", "each agent", "end", "metric", "Version history:", "v0:"):
        assert row in doc, f"{task_id}: the doc page lacks {row!r}"


def test_template_task_conforms_when_registered_by_hand() -> None:
    pm = get_plugin_manager()
    pm.register(optima_task_template, name="template")
    assert "example/template-v0" in list_tasks(pm)
    check_task("example/template-v0", pm=pm, answer_text=answer_turn)
    assert "example/template-v0" not in list_tasks()  # not registered by default


# -- the checks catch broken tasks -----------------------------------------------------------------


class FormatTask(TinyTask):
    """A tiny task with a two-format pool; ``bug`` breaks one rule of the contract."""

    num_formats = 2

    def __init__(self, bug: str = "") -> None:
        super().__init__()
        self.bug = bug

    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        deal = rng.random() if self.bug != "global_random" else random.random()
        views = {}
        for agent in self.agents[: 1 if self.bug == "missing_agent" else None]:
            fact = f"{agent} holds clue {sample.id}."
            base = f"You are {agent}. {sample.question} {fact} ({deal:.3f})"
            block = "" if format_index is None else f"\nFormat {format_index}: k=v"
            prompt = base + block
            if self.bug == "block_in_base":
                base = prompt
            if self.bug == "no_block":
                prompt = base
            private = {"hidden_evidence": (), "evidence_not_in_prompt": ("other",)}.get(self.bug, (fact,))
            views[agent] = AgentView(
                agent=agent, system_prompt=prompt, base_system_prompt=base, private=private
            )
        return views

    def extract_answer(self, text: str) -> str | None:
        if self.bug == "extract_raises" and "\\boxed{" in text:
            raise ValueError("unbalanced")
        if self.bug == "extract_returns_list":
            return [text]  # type: ignore[return-value]
        return super().extract_answer(text)

    def score(self, answer: str | None, sample: TaskSample) -> float:
        if self.bug == "score_above_one":
            return 2.0
        if self.bug == "gold_scores_zero":
            return 0.0
        return super().score(answer, sample)


def test_a_correct_task_passes() -> None:
    report = check_task(FormatTask(), api_cycles=5)
    assert report.formats_checked == 2 and report.task_id == "FormatTask"


@pytest.mark.parametrize(
    "bug,check",
    [
        ("missing_agent", "views"),
        ("global_random", "views"),
        ("block_in_base", "formats"),
        ("no_block", "formats"),
        ("extract_raises", "extract"),
        ("extract_returns_list", "extract"),
        ("hidden_evidence", "evidence"),
        ("evidence_not_in_prompt", "evidence"),
        ("score_above_one", "score"),
        ("gold_scores_zero", "score"),
    ],
)
def test_each_broken_rule_is_reported(bug: str, check: str) -> None:
    with pytest.raises(TaskContractError, match=f"fails check '{check}'"):
        check_task(FormatTask(bug=bug), api_cycles=5)


def test_task_kwargs_need_a_task_id() -> None:
    with pytest.raises(TaskContractError, match="task_kwargs only apply"):
        check_task(FormatTask(), task_kwargs={"data_dir": "x"})


@pytest.mark.parametrize(
    "module",
    [
        "optima_env.families.base",
        "optima_env.families.dealing",
        "optima_env.families.debate",
        "optima_env.prompts",
    ],
)
def test_doctests_of_the_task_modules(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
