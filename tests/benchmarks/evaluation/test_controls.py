"""The controls: the computed ceiling, the final-hop holder alone, and each system's counterfactual
(its first agent's evidence from another instance), end to end through the CLI."""

from __future__ import annotations

import json
import random

import pytest

from benchmarks.evaluation.methods import (
    OneHandTask,
    PlaySettings,
    SwappedEvidence,
    build_methods,
    counterfactual,
    with_controls,
)
from optima_env import TaskContractError, make_task
from tests.benchmarks.test_run import _run


def test_a_communicating_system_falls_under_the_counterfactual_and_the_table_says_so(tmp_path) -> None:
    """The scripted reader follows the facts it hears: it answers only when Alice's fact reaches
    Bob, so with Alice's evidence from another instance it drops to the ceiling or below."""
    out = tmp_path / "run"
    proc = _run("--task", "ie/synth-v1", "--model", "scripted", "--controls", "--checkpoint",
                "reader=scripted", "--episodes", "24", "--out", str(out), "--no-progress")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Controls (what a system scores without passing the evidence on):" in proc.stdout
    ceiling = "| ie/synth-v1 | Shortcut ceiling (computed: no bridging evidence passed on) | 0.125 | – |"
    assert ceiling in proc.stdout
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    rows = {r["method_key"]: r for r in results["rows"]}
    assert set(rows) == {"cot", "mad", "one_hand", "ckpt:reader", "cf:ckpt:reader"}
    (pair,) = results["controls"]["counterfactuals"]
    assert pair["system"] == "reader" and pair["counterfactual"] == "reader (counterfactual)"
    assert pair["score"] <= results["controls"]["ceilings"]["ie/synth-v1"] + 0.1
    assert pair["difference_ci"][1] < 0  # the drop's interval is above 0
    assert rows["one_hand"]["score"] <= 0.25 and rows["one_hand"]["f1"] is not None


def test_the_one_hand_agent_sees_only_the_final_hop_holders_facts() -> None:
    task = make_task("ie/synth-v1", style="small")
    sample = task.sample("test", 0)
    views = OneHandTask(task).views(sample, rng=random.Random(0))
    (view,) = views.values()
    assert view.agent == "Bob" and view.private == sample.context[1].sentences
    assert not any(fact in view.system_prompt for fact in sample.context[0].sentences)


def test_the_counterfactual_gives_alice_the_next_instances_facts_and_keeps_the_gold() -> None:
    task = make_task("ie/synth-v1", style="small")
    swapped = SwappedEvidence(task).samples("test")
    original = task.samples("test")
    assert swapped[3].context[0] == original[4].context[0]
    assert swapped[3].context[1] == original[3].context[1]
    assert swapped[3].answers == original[3].answers and swapped[3].question == original[3].question
    assert swapped[len(original) - 1].context[0] == original[0].context[0]  # the last takes the first's


def test_controls_are_added_once_and_only_multi_agent_systems_get_a_counterfactual() -> None:
    settings = PlaySettings(max_turns=4, max_new_tokens=32)
    methods = with_controls(build_methods(("cot", "mad"), {"A": "scripted"}, settings), settings)
    assert [m.key for m in methods] == ["cot", "mad", "one_hand", "ckpt:A", "cf:ckpt:A"]
    assert [m.key for m in with_controls(methods[:3], settings)] == ["cot", "mad", "one_hand"]
    with pytest.raises(TaskContractError, match="a single agent"):
        counterfactual(methods[0])


def test_a_task_without_private_evidence_or_swap_refuses_the_controls_clearly() -> None:
    task = make_task("debate/gsm8k-v0") if "debate/gsm8k-v0" in _tasks() else None
    if task is None:
        pytest.skip("the GSM8K plugin is not installed")
    with pytest.raises(TaskContractError, match="cannot swap an agent's evidence"):
        SwappedEvidence(task)
    v0 = make_task("ie/synth-v0")
    with pytest.raises(TaskContractError, match="no counterfactual control"):
        SwappedEvidence(v0)


def _tasks() -> list[str]:
    from optima_env import list_tasks

    return list(list_tasks())
