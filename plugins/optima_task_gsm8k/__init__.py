"""GSM8K: a solver and a critic debate grade-school math word problems.

============  ==================================================================================
id            ``debate/gsm8k-v0``
family        debate (spec §2.2)
agents        Alice = solver (speaks first), Bob = critic. ``num_agents=3`` or more: peers with
              no fixed roles (:data:`optima_env.prompts.PEER_DEBATE_PROMPT`)
each agent    the question, no private evidence. Alice: "think step by step, end with
              ``\\boxed{N}``, the box holding only a number"; Bob: find Alice's errors and
              suggest fixes, tersely, never giving the answer
end           the same answer twice in a row among answer-bearing turns, or ``max_turns`` (10),
              or a turn of 2000+ tokens (spec §2.4). A turn's answer is the reference parser's:
              the content of the last ``\\boxed{`` (none when it is unclosed), normalized
              (units, ``$``, commas in numbers, text before ``=`` removed);
              ``math_answers="lenient"`` is the lenient extraction; ``style="small"`` (for models
              that do not box): the box, else the last "answer is X" line's number, else the
              turn's last number (a departure from the reference)
metric        accuracy: ``gsm8k_mode="code"`` (default) is the reference training reward: the
              answer (the reference parser's normalized box content) equals the gold string
              after ``####`` (:func:`optima_env.scoring.reference_exact_match`);
              ``"numeric"``: the first number of the answer equals the gold number within 1e-6;
              ``"code_eval"``: the reference eval script (first number of the normalized answer)
data          ``gsm8k``: ``train`` (7,473), ``test`` (1,319). Local JSONL in
              ``$OPTIMA_DATA_DIR/gsm8k/`` or the hub's ``gsm8k`` (main)
pool          none (``num_formats == 0``): math has a fixed structure (spec §4)
============  ==================================================================================

Factory arguments: ``num_agents``, ``gsm8k_mode``, ``math_answers``, ``style``, ``data_dir``, ``source``,
``limit``, ``hf_name``.

Version history:
    v0: first release.
"""

from __future__ import annotations

from typing import Any

from optima_env import Recipe, TaskContractError, TaskSpec, hookimpl
from optima_env.families import MathDebateTask
from optima_env.prompts import GSM8K_SOLVER_PROMPT
from optima_env.scoring import gsm8k_equal, reference_exact_match
from optima_env.types import TaskSample

__all__ = ["GSM8KTask", "optima_register_recipes", "optima_register_tasks"]

TASK_ID = "debate/gsm8k-v0"
_MODES = ("numeric", "code", "code_eval")


class GSM8KTask(MathDebateTask):
    """GSM8K solver/critic debate (see the module docstring)."""

    dataset = "gsm8k"
    solver_prompt = GSM8K_SOLVER_PROMPT
    numeric_answers = True

    def __init__(self, *, gsm8k_mode: str = "code", **kwargs: Any) -> None:
        if gsm8k_mode not in _MODES:
            raise TaskContractError(f"gsm8k_mode must be one of {list(_MODES)}, got {gsm8k_mode!r}")
        super().__init__(**kwargs)
        self.gsm8k_mode = gsm8k_mode

    def score(self, answer: str | None, sample: TaskSample) -> float:
        if self.gsm8k_mode == "code":
            return reference_exact_match(answer, sample.answer)
        return float(gsm8k_equal(answer, sample.answer, mode=self.gsm8k_mode))  # type: ignore[arg-type]

    def scorer_name(self, tokenizer: object = None) -> str:
        """``exact-match`` (the reference's training reward), ``gsm8k-numeric`` or ``gsm8k-code_eval``."""
        return "exact-match" if self.gsm8k_mode == "code" else f"gsm8k-{self.gsm8k_mode}"


# Recipes of the built-in trainers for this task (spec §5-§7 tables), registered as Recipe
# records below: the reference code's recipes, and as "paper" the paper's Table 8 values where
# they differ (spec §13 item 5). Each states only what differs from the defaults: the fields of
# optima_trainers.config under the trainer's own (tests/optima_trainers/config/test_recipes.py).
_ISFT = {
    "sft.learning_rate": 2e-06,
    "sft.epochs": 3,
    "sft.batch_size": 16,
    "reward.lambda_token": 0.4,
    "reward.lambda_loss": 0.9,
    "selection.theta": 0.6,
    "generation.num_samples": 10,
    "generation.instances": 7000,
    "sft.restart_from_base": True,
    "generation.init_temperature": 0.7,
}
RECIPES = {
    "code": {
        "isft": {**_ISFT, "iterations": 6},
        "idpo": {
            **_ISFT,
            "iterations": 5,
            "dpo.beta": 0.25,
            # iDPO's own weights (Table 8), apart from the iSFT initialization's reward.*
            "tree.lambda_token": 0.6,
            "tree.lambda_loss": 0.7,
            "tree.theta_filter": 0.5,
            "tree.instances": 7000,
        },
        "isft-dpo": {
            **_ISFT,
            "sft.learning_rate": 1e-06,
            "iterations": 3,
            "dpo.beta": 0.5,
            "tree.theta_filter": 0.45,
            "tree.instances": 7000,
        },
    },
    "paper": {"idpo": {"dpo.beta": 0.2, "tree.theta_filter": 0.4}, "isft-dpo": {"tree.theta_filter": 0.4}},
}


@hookimpl
def optima_register_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id=TASK_ID,
            factory=GSM8KTask,
            family="debate",
            description="GSM8K solver/critic debate; boxed numeric answer; accuracy.",
        )
    ]


@hookimpl
def optima_register_recipes() -> list[Recipe]:
    return Recipe.table(TASK_ID, RECIPES)
