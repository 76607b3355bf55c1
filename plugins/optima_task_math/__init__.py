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
              or a turn of 2000+ tokens (spec §2.4). A turn's answer is the content of its last
              balanced ``\\boxed{}``, normalized like the reference parser (Lewkowycz et al.
              2022), so ``\\dfrac12`` and ``1/2`` are the same answer
metric        accuracy: :func:`optima_env.scoring.math_equal` (normalized strings, then
              symbolic/numeric equivalence with ``math_verify``, ``math_timeout`` seconds in a
              worker process; ``\\frac{1}{2}`` equals ``0.5``); never ``eval``
data          ``math``: ``train`` (7,500), ``test`` (5,000), ``math500``; gold = the last boxed
              answer of the reference solution. Local JSONL in ``$OPTIMA_DATA_DIR/math/`` or the
              hub's ``EleutherAI/hendrycks_math``
pool          none (``num_formats == 0``): math has a fixed structure (spec §4)
============  ==================================================================================

Factory arguments: ``num_agents``, ``math_timeout``, ``data_dir``, ``source``, ``limit``,
``hf_name``.

Version history:
    v0: first release.
"""

from __future__ import annotations

import math
from typing import Any

from optima_env import TaskContractError, TaskSpec, hookimpl
from optima_env.families import MathDebateTask
from optima_env.prompts import MATH_SOLVER_PROMPT
from optima_env.scoring import math_equal
from optima_env.types import TaskSample

__all__ = ["MATHTask", "optima_register_tasks"]

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
