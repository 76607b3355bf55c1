"""The benchmark report says which scorer produced each number: the episodes' scorer (and whether
it had a tokenizer) is recorded, and the long table shows it in a column of its own."""

from __future__ import annotations

from benchmarks.evaluation.outputs import _scorers
from benchmarks.reports.report import long_table
from optima_env import ConversationEnv
from optima_env.policy import ScriptedPolicy
from optima_env.rollout import run_episode


def test_the_long_table_names_the_scorer_of_each_row() -> None:
    from optima_task_synth import SyntheticChainTask

    env = ConversationEnv(SyntheticChainTask(), max_turns=2)
    episode = run_episode(
        env, ScriptedPolicy.from_turns(["<A>x</A>", "<A>x</A>"]), seed=0, options={"index": 0}
    )
    assert _scorers([[episode], [episode]]) == "f1-squad (no tokenizer)"  # no tokenizer given
    row = {"task": "ie/synth-v0", "method": "MAD", "status": "ok", "score": 0.5, "scorer": "f1-tokens",
           "mean_tokens": 12.0, "episodes": 2}  # fmt: skip
    table = long_table([row])
    assert "| task | method | score | scorer | mean #tokens | episodes |" in table
    assert "| ie/synth-v0 | MAD | 0.500 | f1-tokens | 12.0 | 2 |" in table
