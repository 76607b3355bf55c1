"""MATH (Hendrycks competition math): a solver and a critic debate each problem.

============  ==================================================================================
id            ``debate/math-v0``
family        debate (spec §2.2)
agents        Alice = solver (speaks first), Bob = critic. ``num_agents=3`` or more: peers with
              no fixed roles (:data:`optima_env.prompts.PEER_DEBATE_PROMPT`)
each agent    the problem, no private evidence. Alice: "think step by step, end with
              ``\\boxed{answer}``"; Bob: find Alice's errors and suggest fixes, tersely, never
              giving the answer
end           the same answer twice in a row among answer-bearing turns, or ``max_turns`` (10),
              or a turn of 2000+ tokens (spec §2.4). A turn's answer is the reference parser's:
              the content of the last ``\\boxed{`` (none when it is unclosed), normalized as
              Lewkowycz et al. (2022); ``math_answers="lenient"`` takes the last balanced box
              with a fuller normalization, so ``\\dfrac12`` and ``1/2`` are the same answer
metric        accuracy: :func:`optima_env.scoring.math_equal` (normalized strings, then
              symbolic/numeric equivalence with ``math_verify``, ``math_timeout`` seconds in a
              worker process; ``\\frac{1}{2}`` equals ``0.5``); never ``eval``
data          ``math``: ``train`` (7,500), ``test`` (5,000), ``math500``; gold = the last boxed
              answer of the reference solution. Local JSONL in ``$OPTIMA_DATA_DIR/math/`` or the
              hub's ``EleutherAI/hendrycks_math``
pool          none (``num_formats == 0``): math has a fixed structure (spec §4)
============  ==================================================================================

Factory arguments: ``num_agents``, ``math_timeout``, ``math_answers``, ``style``, ``data_dir``, ``source``,
``limit``, ``hf_name``.

Version history:
    v0: first release.
"""

from __future__ import annotations

import math
from typing import Any

from optima_env import Recipe, TaskContractError, TaskSpec, hookimpl
from optima_env.families import MathDebateTask
from optima_env.prompts import MATH_SOLVER_PROMPT
from optima_env.scoring import math_equal
from optima_env.types import TaskSample

__all__ = ["MATHTask", "optima_register_recipes", "optima_register_tasks"]

TASK_ID = "debate/math-v0"


class MATHTask(MathDebateTask):
    """MATH solver/critic debate (see the module docstring)."""

    dataset = "math"
    solver_prompt = MATH_SOLVER_PROMPT

    def __init__(self, *, math_timeout: float = 5.0, **kwargs: Any) -> None:
        if (
            isinstance(math_timeout, bool)
            or not isinstance(math_timeout, (int, float))
            or not (math.isfinite(math_timeout) and math_timeout > 0)
        ):
            raise TaskContractError(
                f"math_timeout must be a positive number of seconds, got {math_timeout!r}"
            )
        super().__init__(**kwargs)
        self.math_timeout = float(math_timeout)

    def score(self, answer: str | None, sample: TaskSample) -> float:
        return float(math_equal(answer, sample.answer, timeout=self.math_timeout))

    def scorer_name(self, tokenizer: object = None) -> str:
        """``math-verify`` (equivalence; the reference used sympy's ``parse_latex``, spec §2.5)."""
        return "math-verify"


# Recipes of the built-in trainers for this task (spec §5-§7 tables), registered as Recipe
# records below: the reference code's recipes, and as "paper" the paper's Table 8 values where
# they differ (spec §13 item 5). Each states only what differs from the defaults: the fields of
# optima_trainers.config under the trainer's own (tests/optima_trainers/config/test_recipes.py).
# _SHARED: what all three recipes set; _ISFT adds the iSFT initialization's own
# SFT batch size (isft-dpo keeps the default).
_SHARED = {
    "sft.learning_rate": 1e-06,
    "sft.epochs": 3,
    "reward.lambda_token": 0.4,
    "reward.lambda_loss": 0.8,
    "selection.theta": 0.6,
    "generation.num_samples": 10,
    "generation.instances": 7500,
    "selection.keep": (0.1, 0.8),
    "sft.restart_from_base": True,
    "generation.init_temperature": 0.7,
}
_ISFT = {**_SHARED, "sft.batch_size": 16}
RECIPES = {
    "code": {
        "isft": {**_ISFT, "iterations": 6},
        "idpo": {
            **_ISFT,
            "iterations": 5,
            # iDPO's own weights (Table 8), apart from the iSFT initialization's reward.*
            "tree.lambda_token": 0.5,
            "tree.lambda_loss": 0.7,
            "tree.instances": 7000,
        },
        "isft-dpo": {
            **_SHARED,
            "sft.epochs": 4,
            "reward.lambda_loss": 0.9,
            "generation.instances": 7000,
            "iterations": 3,
            "tree.theta_filter": 0.45,
            "tree.instances": 7000,
        },
    },
    "paper": {"isft": {"reward.lambda_loss": 0.9}, "isft-dpo": {"tree.theta_filter": 0.4}},
}


@hookimpl
def optima_register_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id=TASK_ID,
            factory=MATHTask,
            family="debate",
            description="MATH solver/critic debate; boxed answer; math-verify equivalence.",
        )
    ]


@hookimpl
def optima_register_recipes() -> list[Recipe]:
    return Recipe.table(TASK_ID, RECIPES)
