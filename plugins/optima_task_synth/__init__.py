"""Synthetic chain QA: the embedded default task, procedurally generated, no download needed.

A small world of invented entities (people, companies, cities, countries, languages; names are
made up so no model can know them) is generated per instance. The question follows a chain of
``hops`` relations from a person, e.g. for 2 hops: *In which city is the company that Tavo Rinek
works for headquartered?* The chain's facts are dealt to different agents, so they must exchange
what they know; :func:`solve` is the symbolic solver the tests use to check that no agent can
answer alone.

=================  ===========================================================================
``ie/synth-v1``    the task that only communication solves (:mod:`optima_task_synth.v1`): the
                   final-hop holder sees 8 candidate answers, and without the facts held by
                   its partner no strategy beats 1/8; scored by ``names-gold``
``ie/synth-v0``    the first version (:mod:`optima_task_synth.v0`), kept for the results made
                   with it; its docstring says what it leaks
=================  ===========================================================================

Instances are deterministic functions of ``(seed, split, index)``; train and test never overlap.
"""

from __future__ import annotations

from optima_env import Recipe, TaskSpec, hookimpl
from optima_task_synth.common import hand_facts
from optima_task_synth.v0 import TASK_ID, SyntheticChainTask, generate
from optima_task_synth.v1 import TASK_ID as TASK_ID_V1
from optima_task_synth.v1 import CommunicationChainTask, generate_v1, shortcut_ceiling
from optima_task_synth.world import Fact, solve

__all__ = [
    "CommunicationChainTask",
    "Fact",
    "SyntheticChainTask",
    "generate",
    "generate_v1",
    "hand_facts",
    "optima_register_recipes",
    "optima_register_tasks",
    "shortcut_ceiling",
    "solve",
]

# Recipes of the built-in trainers for this task (spec §5-§7 tables), registered as Recipe
# records below: the reference code's recipes, and as "paper" the paper's Table 8 values where
# they differ (spec §13 item 5). Each states only what differs from the defaults: the fields of
# optima_trainers.config under the trainer's own (tests/optima_trainers/config/test_recipes.py).
# Synth (not a paper task) is sized for the embedded 135M model: its rewards are all negative, so
# theta_sft -0.5, theta_filter -1 and theta_diff 0.05 let the best of each group through (the
# top-70% and top-half cuts still apply).
_ISFT = {
    "sft.batch_size": 8,
    "selection.theta": -0.5,
}
_TREE = {"iterations": 1, "tree.theta_filter": -1.0, "tree.theta_diff": 0.05, "tree.instances": 2}
RECIPES = {
    "code": {"isft": {**_ISFT, "iterations": 6}, "idpo": {**_ISFT, **_TREE}, "isft-dpo": {**_ISFT, **_TREE}},
    "paper": {"idpo": {"iterations": 5}},
}


@hookimpl
def optima_register_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id=TASK_ID,
            factory=SyntheticChainTask,
            family="information_exchange",
            description="Procedural chain QA, first version (leaks a shortcut; see its docstring).",
        ),
        TaskSpec(
            id=TASK_ID_V1,
            factory=CommunicationChainTask,
            family="information_exchange",
            description="Procedural chain QA that only communication solves (embedded default).",
        ),
    ]


@hookimpl
def optima_register_recipes() -> list[Recipe]:
    return [*Recipe.table(TASK_ID, RECIPES), *Recipe.table(TASK_ID_V1, RECIPES)]
