"""Named benchmark suites: which tasks, methods, instances and generation budget a run uses.

=========  ==========================================================================================
suite      what it runs
=========  ==========================================================================================
main       the default (the README's main command): the demo's synthetic task, untrained CoT and MAD
           with the controls (the one-hand row and the computed ceiling), and the adapters of the
           demo's trainers on that task with their counterfactuals (none today: the probe found
           nothing to train at 135M, ``benchmarks/results/probe/NOTES.md``), the demo's caps,
           30 held-out instances
smoke      the embedded task with the embedded model, CoT and MAD on 4 test instances, short
           turns; a few minutes on 2 CPU cores
paper      spec §8.1: the eight paper tasks, the first 1000 test items of the information-exchange
           sets and the full debate test sets, CoT, SC (n=8), MAD and AutoForm (plus every
           ``--checkpoint``), 10 turns of up to 2000 tokens; meant for a GPU with vLLM
scaling    spec §8.3: K samples per instance at temperature 0.5 of each method (MAD and CoT by
           default), majority-vote score, coverage and total tokens for k = 1..K
rollout    the throughput benchmark of ``benchmarks.throughput.rollout_bench`` (rollout engine vs naive loop)
handoff    seconds from a trained stage to the next stage's first token on vLLM-CPU: new engine per
           stage vs weights loaded in place vs a LoRA adapter (``benchmarks.throughput.handoff_bench``;
           ``--episodes N`` repetitions, default 3)
baselines  the demo's untrained baselines (CoT, SC n=8, MAD, AutoForm) with its evaluation settings
           (100 instances, 10 turns of 256 tokens, greedy, answers read in style ``small``, turns
           cut at a partner's tag) on the tasks given by ``--task`` (default: 2WikiMultihopQA)
demo       Table 1 on CPU (``benchmarks.demo.suite``): iSFT, iDPO and iSFT-DPO trained on the embedded
           task and HotpotQA, then CoT, SC, MAD, AutoForm and the committed adapters on 100
           held-out instances, every stage's curve and the inference-scaling figure; many hours
           on 2 cores, resumed from its ``--out`` folder after any stop
=========  ==========================================================================================

Command-line flags override a suite's defaults (``--task``, ``--methods``, ``--episodes``, ...).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.demo.tasks import DEMO_SUITE, DEMO_TASKS, MAIN_TASK, trainer_label
from benchmarks.evaluation.suite_spec import Suite
from optima_env.errors import TaskContractError

__all__ = ["DEMO_ADAPTERS", "PAPER_TASKS", "SUITES", "Suite", "get_suite"]

PAPER_TASKS: tuple[tuple[str, ...], ...] = (
    ("hotpotqa",),
    ("2wikimultihopqa", "2wiki", "2wmh", "twowiki"),
    ("triviaqa",),
    ("cbt",),
    ("math",),
    ("gsm8k",),
    ("arc_challenge", "arc-challenge", "arc_c", "arc"),
    ("mmlu",),
)
"""The paper's tasks in Table 1 order; each is a list of accepted registered names (the first
that resolves is used, through :func:`optima_env.resolve_task_id`)."""


_REPO = Path(__file__).resolve().parents[1]
DEMO_ADAPTERS = _REPO / "benchmarks" / "results" / "demo" / "adapters"
"""Where the demo suite writes the committed adapters (``<task name>/<trainer>``)."""

_DEMO_IE = next(t for t in DEMO_TASKS if t.task == "ie/hotpotqa-v0")
"""The demo's HotpotQA recipe, whose baselines the ``baselines`` suite plays on other tasks."""

SUITES: dict[str, Suite] = {
    "main": Suite(
        name="main",
        description="the demo's synthetic task: untrained CoT and MAD with the controls, and the "
        "committed adapters of the demo's trainers on it",
        tasks=((MAIN_TASK.task,),),
        methods=("cot", "mad"),
        instances=30,
        max_turns=MAIN_TASK.max_turns,
        max_new_tokens=MAIN_TASK.max_new_tokens,
        task_kwargs={MAIN_TASK.task: dict(MAIN_TASK.task_kwargs)},
        stop_at_speaker_tags=True,
        controls=True,
        concurrency=32,  # every instance in one batch: on this CPU bs32 decodes 2x bs8 (feasibility §2)
        adapters=tuple((trainer_label(t), str(DEMO_ADAPTERS / MAIN_TASK.name / t))
                       for t in MAIN_TASK.trainers),
    ),
    "smoke": Suite(
        name="smoke",
        description="embedded task and model, CoT and MAD on 4 instances (minutes on 2 CPU cores)",
        methods=("cot", "mad"),
        instances=4,
        max_turns=4,
        max_new_tokens=64,
    ),
    "paper": Suite(
        name="paper",
        description="spec §8.1 evaluation sets, every baseline and checkpoint (a GPU with vLLM)",
        tasks=PAPER_TASKS,
        methods=("cot", "sc", "mad", "autoform"),
        instances=None,
        ie_instances=1000,
        max_turns=10,
        max_new_tokens=2000,
        sc_n=8,
        backend="vllm",
    ),
    "scaling": Suite(
        name="scaling",
        description="spec §8.3 inference scaling: K samples at T=0.5, vote / coverage / tokens per k",
        methods=("mad", "cot"),
        instances=4,
        max_turns=4,
        max_new_tokens=64,
        scaling_k=8,
        scaling=True,
    ),
    "rollout": Suite(
        name="rollout",
        description="rollout-engine throughput benchmark (benchmarks.throughput.rollout_bench)",
    ),
    "loop": Suite(
        name="loop",
        description="one iSFT and one iDPO iteration per phase, transformers engine new vs old (loop_bench)",
    ),
    "handoff": Suite(
        name="handoff",
        description="stage handoff on vLLM-CPU: reload vs in-place weights vs LoRA adapter (handoff_bench)",
    ),
    "baselines": Suite(
        name="baselines",
        description="the demo's untrained baselines and evaluation settings on other tasks (--task)",
        tasks=(("ie/2wikimultihopqa-v0",),),
        methods=_DEMO_IE.baselines,
        instances=_DEMO_IE.eval_instances,
        max_turns=_DEMO_IE.max_turns,
        max_new_tokens=_DEMO_IE.max_new_tokens,
        sc_n=_DEMO_IE.sc_n,
        task_kwargs={t: dict(_DEMO_IE.task_kwargs) for t in ("ie/hotpotqa-v0", "ie/2wikimultihopqa-v0")},
        stop_at_speaker_tags=True,
        concurrency=32,
    ),
    "demo": DEMO_SUITE,
}


def get_suite(name: str) -> Suite:
    """The suite called ``name``; raises :class:`TaskContractError` listing the suites."""
    try:
        return SUITES[name]
    except KeyError:
        raise TaskContractError(f"no suite {name!r}; expected one of {', '.join(SUITES)}") from None
