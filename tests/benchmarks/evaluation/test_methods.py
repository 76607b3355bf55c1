"""Methods, prompts, voting, the viewer and the report tables, on hand-made inputs."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from benchmarks.evaluation.methods import (
    PlaySettings,
    SingleAgentTask,
    StyledTask,
    build_methods,
    scaling_curve,
    vote,
)
from benchmarks.evaluation.prompts import answer_format
from benchmarks.reports.report import long_table, paper_tables
from benchmarks.reports.viewer import render_viewer
from optima_env import AgentView, Episode, RewardBreakdown, TaskContractError, Turn, make_task
from optima_env.scoring import extract_boxed
from tests.helpers import TinyTask

SETTINGS = PlaySettings(max_turns=4, max_new_tokens=32)


def _episode(answer: str | None, score: float, tokens: int = 10, text: str = "Alice: hi") -> Episode:
    return Episode(
        task_id="t/x-v0",
        sample_id="s0",
        seed=0,
        agents=("Alice",),
        turns=(Turn(index=0, agent="Alice", text=text, num_tokens=tokens, answer=answer),),
        final_answer=answer,
        gold=("gold",),
        task_score=score,
        terminated=False,
        truncated=True,
        end_reason="max_turns",
        num_tokens=tokens,
        system_prompts={"Alice": "be <b>bold</b>"},
        base_system_prompts={"Alice": "be <b>bold</b>"},
        reward=RewardBreakdown(
            task=score,
            token=-0.1,
            readability=0.0,
            total=score - 0.1,
            num_tokens=tokens,
            normalizer=100.0,
            flags=("no_readability",),
        ),
        metadata={"method": "sc", "instance": 0, "sample": 0},
    )


class BoxedTask(TinyTask):
    family = "debate"

    def extract_answer(self, text: str) -> str | None:
        return extract_boxed(text)


def test_ie_vote_clusters_by_f1_above_0_9_and_averages_the_largest_group() -> None:
    task = TinyTask()
    episodes = [
        _episode("the Eiffel Tower", 1.0),
        _episode("Paris", 0.0),
        _episode("Eiffel Tower", 0.8),  # F1 1.0 with the first (articles dropped): same group
        _episode("Lyon", 0.0),
    ]
    assert vote(task, episodes, strict=True) == pytest.approx(0.9)


def test_vote_ignores_abstentions_and_uses_exact_strings_outside_ie() -> None:
    episodes = [_episode("12", 1.0), _episode(None, 0.0), _episode("12.0", 0.0), _episode("12", 1.0)]
    assert vote(BoxedTask(), episodes, strict=True) == 1.0
    assert vote(BoxedTask(), [_episode(None, 0.0), _episode(None, 0.0)], strict=True) == 0.0
    # a tie goes to the earliest group
    assert vote(BoxedTask(), [_episode("3", 0.0), _episode("4", 1.0)], strict=True) == 0.0


def test_scaling_curve_is_vote_coverage_and_tokens_of_the_first_k() -> None:
    episodes = [_episode("a", 0.0, 5), _episode("b", 1.0, 7), _episode("b", 1.0, 9)]
    curve = scaling_curve(BoxedTask(), episodes)
    assert [p["score"] for p in curve] == [0.0, 0.0, 1.0]
    assert [p["coverage"] for p in curve] == [0.0, 1.0, 1.0]
    assert [p["tokens"] for p in curve] == [5.0, 12.0, 21.0]


def test_answer_format_probes_the_task_extractor() -> None:
    assert answer_format(TinyTask()) == "tag"
    assert answer_format(BoxedTask()) == "boxed"


def test_single_agent_sees_every_agents_evidence() -> None:
    task = make_task("ie/synth-v0")
    sample = task.samples("test")[0]
    views = task.views(sample, rng=random.Random(0))
    single = SingleAgentTask(task)
    (view,) = single.views(sample, rng=random.Random(0)).values()
    for v in views.values():
        assert v.private and all(line in view.system_prompt for line in v.private)
    assert "<A>answer</A>" in view.system_prompt and single.agents == ("Alice",) and single.id == task.id
    assert not single.enforce_name_prefix


def test_mad_prompts_ask_for_natural_language_and_autoform_for_concise_formats() -> None:
    task = make_task("ie/synth-v0")
    sample = task.samples("test")[0]
    own = task.views(sample, rng=random.Random(0))
    mad = StyledTask(task, "natural").views(sample, rng=random.Random(0))
    autoform = StyledTask(task, "autoform").views(sample, rng=random.Random(0))
    for agent in task.agents:
        assert "natural language" in mad[agent].system_prompt
        assert (
            "compact format" in own[agent].system_prompt and "compact format" not in mad[agent].system_prompt
        )
        assert "non-natural-language format that is concise" in autoform[agent].system_prompt
        assert all(line in mad[agent].system_prompt for line in own[agent].private)  # same dealing
        assert f'Begin your response with "{agent}:"' in mad[agent].system_prompt


def test_a_task_can_supply_its_own_styled_views() -> None:
    class Styled(TinyTask):
        def styled_views(self, sample, *, rng, style) -> Mapping[str, AgentView]:
            return {
                a: AgentView(agent=a, system_prompt=f"{style}!", base_system_prompt="") for a in self.agents
            }

    views = StyledTask(Styled(), "autoform").views(Styled().samples("test")[0], rng=random.Random(0))
    assert {v.system_prompt for v in views.values()} == {"autoform!"}


def test_build_methods_orders_rows_and_validates() -> None:
    methods = build_methods(["cot", "sc", "mad", "autoform"], {"iSFT": "/m/isft"}, SETTINGS)
    assert [m.label for m in methods] == ["CoT", "SC (n=8)", "MAD", "AutoForm", "iSFT"]
    assert methods[1].samples == 8 and methods[1].temperature > 0 and methods[-1].model == "/m/isft"
    assert all(m.temperature == 0 for m in methods if m.key != "sc")
    scaling = build_methods(["mad"], {}, SETTINGS, scaling=True)
    assert scaling[0].key == "scaling:mad" and scaling[0].samples == 8 and scaling[0].temperature == 0.5
    with pytest.raises(TaskContractError, match="unknown method 'tot'"):
        build_methods(["tot"], {}, SETTINGS)


def test_viewer_escapes_model_output_and_shows_the_reward_breakdown() -> None:
    episode = _episode("x", 0.5, text="Alice: <script>alert('x')</script> & <A>x</A>")
    row = {
        "task": "t/x-v0",
        "method": "M<1>",
        "score": 0.5,
        "mean_tokens": 10.0,
        "episodes": 1,
        "instances": 1,
    }
    page = render_viewer("run <1>", [(row, [episode])])
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp;" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page and "M&lt;1&gt;" in page
    assert "no_readability" in page and "<th>total</th>" in page


def test_tables_show_missing_tasks_and_percent_scores() -> None:
    results = {
        "tasks": [
            {"task": "ie/a-v0", "family": "information_exchange"},
            {"task": "debate/b-v0", "family": "debate"},
        ],
        "methods": [{"label": "CoT"}],
        "rows": [
            {"task": "ie/a-v0", "method": "CoT", "status": "ok", "score": 0.256, "mean_tokens": 123.66,
             "episodes": 3},
            {"task": "debate/b-v0", "method": "CoT", "status": "data missing", "reason": "no | file\nhere",
             "score": None, "mean_tokens": None, "episodes": 0},
        ],
    }  # fmt: skip
    tables = paper_tables(results)
    assert "| Method | ie/a-v0 F1 | #Tok |" in tables and "| CoT | 25.6 | 123.7 |" in tables
    assert "| Method | debate/b-v0 accuracy | #Tok |" in tables and "| CoT | data missing | – |" in tables
    assert "| debate/b-v0 | CoT | data missing: no \\| file here | – | – | 0 |" in long_table(results["rows"])


class DebateTask(BoxedTask):
    """Solver / critic roles with two agents, peers (no roles) with three."""

    def views(self, sample, *, rng, format_index=None) -> Mapping[str, AgentView]:
        roles = ("solver", "critic") if len(self.agents) == 2 else ("peer",) * len(self.agents)
        return {
            a: AgentView(agent=a, system_prompt="terse", base_system_prompt="terse", role=r)
            for a, r in zip(self.agents, roles)
        }


def test_mad_debate_prompts_follow_the_roles() -> None:
    sample = DebateTask().samples("test")[0]
    two = StyledTask(DebateTask(), "natural").views(sample, rng=random.Random(0))
    assert (
        "you solve the problem" in two["Alice"].system_prompt
        and "\\boxed{answer}" in two["Alice"].system_prompt
    )
    assert "do not give the final answer yourself" in two["Bob"].system_prompt
    three = StyledTask(DebateTask(num_agents=3), "natural").views(sample, rng=random.Random(0))
    assert all("nobody has a fixed role" in v.system_prompt for v in three.values())
    assert "Bob and Charlie" in three["Alice"].system_prompt


def test_a_corrupt_trained_checkpoint_is_refused_before_loading(tmp_path) -> None:
    """``--checkpoint`` folders written by the trainers are verified against their manifest."""
    from benchmarks.evaluation.policies import load_policy
    from optima_trainers.run.checkpoint import CorruptCheckpointError
    from tests.optima_trainers.run.test_folder_and_checkpoint import _finished_checkpoint

    target = tmp_path / "ckpt"
    _finished_checkpoint(target)
    (target / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors"):
        load_policy(str(target), backend="hf", batch_size=1)
