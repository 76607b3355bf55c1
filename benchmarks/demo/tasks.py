"""The demo's recipe: which tasks, which trainers, how they train and how they are evaluated.

:data:`DEMO_TASKS` is what ``python -m benchmarks.run --suite demo`` trains and evaluates, and
:data:`MAIN_TASK` (its synthetic task) is what the README's main command, ``python -m
benchmarks.run``, evaluates live with the adapters the demo committed. Every way the recipe departs
from the spec (``../shared/docs/optima-spec.md``) is listed in :attr:`DemoTask.departures` and
printed in the report, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from benchmarks.evaluation.methods import PlaySettings
from benchmarks.evaluation.suite_spec import Suite
from optima_env.errors import TaskContractError

__all__ = [
    "DEMO_ENGINE",
    "DEMO_SUITE",
    "DEMO_TASKS",
    "MAIN_TASK",
    "TRAINERS",
    "DemoTask",
    "eval_settings",
    "stage_label",
    "trainer_label",
]

TRAINERS: tuple[str, ...] = ("isft", "idpo", "isft-dpo")
"""The three Optima variants, trained on every demo task (table order)."""

STAGE_INSTANCES = 30
"""Default of :attr:`DemoTask.stage_instances` (the departures quote it)."""

DEMO_ENGINE: dict[str, str] = {"precision": "float32", "sampler": "multinomial"}
"""The transformers engine the demo evaluates with: the one its committed episodes were generated
with (fp32, per-row ``torch.multinomial``), so a rerun goes on with them instead of refusing to mix
engines (:func:`benchmarks.evaluation.units.check_engine`). The main command decodes with
``--precision auto`` (bf16 linear layers on this CPU, which pass the fidelity check of
``benchmarks/results/rollout_engines``); the demo keeps its committed numbers reproducible."""

DEMO_SUITE = Suite(
    name="demo",
    description="Table 1 on 2 CPU cores: iSFT, iDPO and iSFT-DPO trained on the embedded task "
    "and HotpotQA, against CoT, SC, MAD and AutoForm (hours; resumable)",
    concurrency=32,
)
"""The ``demo`` suite's defaults (listed in :data:`benchmarks.suites.SUITES`)."""

_LABELS = {"isft": "iSFT", "idpo": "iDPO", "isft-dpo": "iSFT-DPO"}


def trainer_label(trainer: str) -> str:
    """The row label of a trainer (``isft`` -> ``iSFT``)."""
    return _LABELS.get(trainer, trainer)


def stage_label(trainer: str, stage: str) -> str:
    """The row label of one stage of one run (``iSFT iter 01``, ``iSFT-DPO iter 00 dpo``)."""
    return f"{trainer_label(trainer)} {stage.replace('iter_', 'iter ').replace('_', ' ')}"


@dataclass(frozen=True, kw_only=True)
class DemoTask:
    """One task of the demo: what is trained, how, and what it is evaluated on."""

    name: str
    """Short name (folder, adapter and plot names)."""
    task: str
    """Registered task id."""
    task_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the task factory (training and evaluation alike)."""
    model: str = "embedded"
    """The starting (untrained) model: ``embedded``, a Hugging Face name or a local folder."""
    trainers: tuple[str, ...] = TRAINERS
    """The trainer backends trained on this task."""
    train: Mapping[str, Any] = field(default_factory=dict)
    """Dotted :class:`~optima_trainers.config.train.TrainConfig` overrides on the cpu profile, shared by
    every trainer (the initialization, M_0, is then the same stage for all three and is trained once)."""
    train_by_trainer: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Per-trainer overrides on top of :attr:`train` (e.g. the number of iterations)."""
    eval_split: str = "test"
    """Held-out split of the evaluation (training reads ``train`` only)."""
    eval_label: str = ""
    """What that split is, when its name does not say (HotpotQA's ``test`` is the dev set)."""
    eval_instances: int = 100
    """Held-out instances of the table: the baselines and the committed adapters (the first N of
    the split)."""
    stage_instances: int = STAGE_INSTANCES
    """Held-out instances every training stage is evaluated on (the per-iteration curves, beside
    MAD and CoT on the same instances): the first N of the table's."""
    max_turns: int = 10
    """Evaluation turn cap, the same for every system (the reference's 10)."""
    max_new_tokens: int = 256
    """Evaluation cap of one turn in tokens, the same for every system."""
    baselines: tuple[str, ...] = ("cot", "sc", "mad", "autoform")
    """Untrained baselines (``benchmarks.evaluation.methods``); ``mad`` is the base of every ratio."""
    sc_n: int = 8
    """Samples of SC."""
    scaling_instances: int = 20
    """Instances of the inference-scaling figure (MAD vs the best trained system, k samples each)."""
    scaling_k: int = 8
    """Samples per instance of the inference-scaling figure (temperature 0.5, as the paper)."""
    adapter_rank: int | None = None
    """Rank of the committed adapters (a truncated SVD of the final model's weight change); None:
    the rank of that change, the sum of its stages' LoRA ranks
    (:func:`benchmarks.demo.train.chain_rank`), so the adapter is the trained model (a rank-8
    export of a 4-stage r-16 chain lost a third of the change: mean relative error 0.33)."""
    departures: tuple[str, ...] = ()
    """How this recipe departs from the spec, and why (printed in the report)."""
    target_score_ratio: float = 1.5
    """Target: the best trained system's score at least this many times MAD's."""
    target_token_ratio: float = 0.2
    """Target: with at most this fraction of MAD's tokens per episode."""
    target_above_cot: bool = False
    """Target: and a score above CoT's."""
    caption: str = ""
    """What the table shows, in words, printed under it (e.g. why a task shows no effect)."""
    retired: str = ""
    """Why this task's table no longer stands as a result (one paragraph): the report keeps it under
    its history with this paragraph, and the README block shows only the paragraph."""
    controls: bool = False
    """Play the controls (:mod:`benchmarks.evaluation.controls`): the one-hand row with the baselines,
    each adapter's counterfactual, and the task's computed shortcut ceiling; the report then checks
    the trained systems against them (:mod:`benchmarks.demo.shortcut`)."""

    def __post_init__(self) -> None:
        if not 0 < self.stage_instances <= self.eval_instances:
            raise TaskContractError(
                f"demo task {self.name}: stage_instances must be in 1..eval_instances "
                f"({self.eval_instances}), got {self.stage_instances}; the stages are evaluated on "
                "the first instances of the table's"
            )

    def config_overrides(self, trainer: str) -> dict[str, Any]:
        """The dotted overrides of ``trainer``'s run."""
        return {**dict(self.train), **dict(self.train_by_trainer.get(trainer, {}))}


def eval_settings(spec: DemoTask) -> PlaySettings:
    """The evaluation settings of a demo task: the same caps for every system, greedy."""
    return PlaySettings(
        max_turns=spec.max_turns,
        max_new_tokens=spec.max_new_tokens,
        temperature=0.0,
        sc_n=spec.sc_n,
        scaling_k=spec.scaling_k,
        scaling_temperature=0.5,
        stop_at_speaker_tags=True,
    )


_COMMON_DEPARTURES = (
    "Model: SmolLM2-135M-Instruct (the embedded model) with LoRA r=16 on every linear layer, fp32, "
    "on 2 CPU cores; the paper fully fine-tunes Llama-3-8B on GPUs.",
    "Generation engine: the transformers rollout engine on the CPU, whose prefix cache keeps each "
    "conversation's KV states across turns.",
    "Answers are read in style 'small' (the <A> tag, else 'Answer: x', else the whole turn, which "
    "F1 credits partly): the untrained 135M model never writes the tag, so under the paper's "
    "tag-only reading every untrained system scores exactly 0 and training has nothing to select.",
    "Selection: theta_sft off (-100) and conversations with a task score above 0 only: at this "
    "model size the Eq. 1 reward cannot separate a partly right answer from a short wrong one.",
    "Turns are cut where the speaker starts writing its partner's 'Name:' tag (the cpu profile; the "
    "reference penalizes impersonation instead), in training and in every evaluated system.",
    "Evaluation caps: 10 turns (the reference's) of at most 256 new tokens (the reference's 2000 "
    "did not fit the CPU budget: untrained systems run to the cap). Training samples shorter "
    "conversations (see the settings), since sampling is most of the compute.",
    "Sizes: the training instances, samples, tree sizes and iterations in the settings below, "
    "against the paper's full training sets; the per-iteration curves show where they stop.",
    f"Per-stage points: every intermediate stage is evaluated on the first {STAGE_INSTANCES} of the "
    f"held-out instances (with MAD and CoT on the same {STAGE_INSTANCES}), not all of them: each "
    "stage costs as much as a system of the table, and the curves need the trend, not the third "
    "decimal.",
)

_COMMON_TRAIN: dict[str, Any] = {
    "generation.init_temperature": 0.5,
    "generation.temperature": 0.5,
    "reward_preset": "paper",
    "selection.theta": -100.0,
    "selection.min_task_score": 1e-9,
    "sft.learning_rate": 2e-4,
    "sft.epochs": 2,
    "generation.precision": DEMO_ENGINE["precision"],
    "generation.sampler": DEMO_ENGINE["sampler"],
}
"""Training overrides every demo task shares: sampling at T=0.5 in every iteration, the Eq. 1
reward with selection among conversations with some credit and theta_sft off (see the
departures), LoRA's learning rate and epochs, and the engine its training records were made with
(:data:`DEMO_ENGINE`)."""

_HOTPOTQA_PAIRS: dict[str, Any] = {"tree.instances": 16, "tree.theta_filter": -1.0, "tree.theta_diff": 0.05}
"""HotpotQA's trees for iDPO and iSFT-DPO: more of them, and the synthetic task's pair thresholds
(see its departures)."""

_SYNTH_PAIRS: dict[str, Any] = {
    "tree.instances": 112,
    "tree.pair_task_credit": True,
    "tree.pair_task_gap": 0.05,
    "tree.depth_cut": "last_answer",
    "tree.pair_fraction": 1.0,
    "dpo.learning_rate": 2e-4,
    "dpo.epochs": 2,
    "dpo.evaluate": True,
}
"""The synthetic task's iDPO and iSFT-DPO recipe (issue 31), chosen by a measured probe of one
iteration on 32 trees: pairs whose chosen side earned more task credit (by more than 0.05), rollouts
cut at the depth limit keep their current answer, every pair that passes is kept, enough trees for
about 100 pairs per stage, and DPO at SFT's learning rate and epochs, with a held-out tenth of the
pairs evaluated each stage (see the departures)."""

_SYNTH_TRAIN: dict[str, Any] = {
    **_COMMON_TRAIN,
    "generation.instances": 32,
    "generation.num_samples": 4,
    "generation.max_turns": 6,
    "generation.max_new_tokens": 64,
    "tree.instances": 16,
    "tree.selections": 6,
    "tree.rollouts": 3,
    "tree.normalizer_instances": 16,
}
"""The synthetic task's training settings (synth-v1 changes only the turn cap, see its departures)."""

_SYNTH_TRAINERS: dict[str, dict[str, Any]] = {
    "isft": {"iterations": 6},
    "idpo": {"iterations": 3, **_SYNTH_PAIRS},
    "isft-dpo": {"iterations": 3, **_SYNTH_PAIRS},
}
"""The synthetic task's iterations per trainer, and the pair rule of the preference-trained ones."""

_SYNTH_V0_RETIRED = (
    "Retired: this table does not show that training taught the agents to exchange their evidence. "
    "At this setting every distractor of ie/synth-v0 is a city fact, so the answer is always one of "
    "Bob's two cities and never Alice's: Bob naming one of his two cities at random scores 0.61, and "
    "Alice saying her own city while Bob names his other one scores 0.765, with the chain fact never "
    "said (computed from the generator on these 100 instances; tests/plugins/test_synth_leaks.py). "
    "The trained iSFT-DPO learned that shortcut: Alice names her employer in 0 of its 100 "
    "conversations and says her own city in her first turn in 99 (counted from eval/episodes.jsonl). "
    "The untrained rows score low mostly on the answer's form (CoT sees all four facts and scores "
    "0.071), so '22x MAD' is mostly a format ratio. ie/synth-v1 replaces it, with controls."
)
"""What synth-v0's demo table learned."""

_SYNTH_V1_NOT_TRAINED = (
    "Not trained: the probe (benchmarks/results/probe/NOTES.md) found nothing for Optima's selection "
    "to keep but guesses. Over 890 conversations sampled by the 135M model at three recipes "
    "(4 or 16 samples per instance, T 0.5 to 1.0, 6 or 2 turns), Alice said the bridging entity in "
    "121 and none of those was credited; the 8 credited conversations were guesses, fewer than "
    "guessing among Bob's 8 cities would earn (about 22.6), and CoT with all the evidence credits 0 "
    "of 30. So no trained row is claimed; the rows here are the untrained systems and the controls, "
    "and the computed ceiling (0.125) is what a trained system would have to beat."
)
"""Why the demo trains nothing on synth-v1 (issue 44's stop rule: a negative probe, reported)."""

DEMO_TASKS: tuple[DemoTask, ...] = (
    DemoTask(
        name="synth-v1",
        task="ie/synth-v1",
        task_kwargs={"hops": 2, "style": "small"},
        trainers=(),  # the recipe below stays for the probe (benchmarks.demo.probe)
        caption=_SYNTH_V1_NOT_TRAINED,
        baselines=("cot", "sc", "mad", "autoform", "one-hand"),
        controls=True,
        train={**_SYNTH_TRAIN, "generation.max_new_tokens": 48},
        train_by_trainer=_SYNTH_TRAINERS,
        eval_instances=100,
        adapter_rank=32,
        target_score_ratio=3.0,
        target_token_ratio=0.1,
        target_above_cot=True,
        departures=(
            *_COMMON_DEPARTURES,
            "Task: ie/synth-v1 at 2 hops: Alice holds the person's employer among 2 rivals' (and one "
            "city fact about a company found nowhere else), Bob the cities of all 8 companies (and one "
            "employer fact about people found nowhere else); without Alice's fact about the person, no "
            "strategy beats 1/8 (tests/plugins/test_synth_leaks.py), so the shortcut ceiling is 0.125.",
            "Metric: names-gold (the final answer names the gold city and no other city of the "
            "instance), so an untrained system's right answer in a sentence counts in full; F1 is "
            "shown beside it.",
            "Preference pairs (iDPO, iSFT-DPO): the synth-v0 recipe (theta_dpo-filter -1, "
            "theta_dpo-diff 0.05, pairs kept only when the chosen side earned more task credit by more "
            "than 0.05, depth-cut rollouts keep their answer, pair_fraction 1, 112 trees per iteration, "
            "DPO at SFT's learning rate and epochs with a tenth of the pairs held out).",
            "Adapters: rank 32, a truncated SVD of each run's final weight change; the table prints "
            "each adapter's own truncation error.",
            "Training turns are cut at 48 new tokens (synth-v0's recipe: 64): no turn of a right "
            "answer by any trained synth-v0 system ran past 27 tokens on the 100 held-out instances, "
            "and sampling time goes to the turns that ramble to the cap.",
        ),
    ),
    DemoTask(
        name="synth",
        task="ie/synth-v0",
        retired=_SYNTH_V0_RETIRED,
        task_kwargs={"hops": 2, "num_distractors": 1, "style": "small"},
        train=_SYNTH_TRAIN,
        train_by_trainer=_SYNTH_TRAINERS,
        eval_instances=100,
        adapter_rank=32,
        target_score_ratio=3.0,
        target_token_ratio=0.1,
        target_above_cot=True,
        departures=(
            *_COMMON_DEPARTURES,
            "Task: 2 hops with one distractor fact per relation and agent: Alice holds the person's "
            "employer (and a rival's), Bob the employers' cities; the symbolic solver "
            "(plugins/optima_task_synth.solve) finds the answer from neither agent's facts alone "
            "(tests/plugins/test_synth.py), so the agents must exchange what they know.",
            "Preference pairs (iDPO, iSFT-DPO): theta_dpo-filter -1 and theta_dpo-diff 0.05 instead "
            "of the reference's 0.4 and 0.2 (tree conversations score a task credit of about 0.01-0.02 "
            "here, so no node passed 0.4), and a pair is kept only when its chosen side earned more "
            "task credit than its rejected side, by more than 0.05 (tree.pair_task_credit, "
            "tree.pair_task_gap): in the previous recipe, without it, pairs were decided by length and "
            "readability and DPO stayed at chance (accuracy 0.5, loss ln 2). A rollout cut at the depth "
            "limit keeps its current answer (the reference scores it 'error'); every pair that passes "
            "is kept (pair_fraction 1, reference 0.5); 112 trees per iteration (about 100 pairs at the "
            "probe's 31 per 32 trees); DPO at SFT's learning rate (2e-4) and epochs (2), a tenth of the "
            "pairs held out and evaluated.",
            "Adapters: the committed adapters are rank 32, a truncated SVD of each run's final weight "
            "change, not the chain's full rank (64 for iDPO, 96 for iSFT and iSFT-DPO, 2 to 3 times "
            "the size): measured on the finished iDPO and iSFT-DPO models, rank 32 leaves a mean "
            "relative error of 0.0043 and 0.0057 per projection (rank 16: 0.044 and 0.047); the table "
            "prints each adapter's own error, and the stage curves score the full final models.",
        ),
    ),
    DemoTask(
        name="hotpotqa",
        task="ie/hotpotqa-v0",
        task_kwargs={"style": "small"},
        train={
            **_COMMON_TRAIN,
            "generation.instances": 24,
            "generation.num_samples": 3,
            "generation.max_turns": 4,
            "generation.max_new_tokens": 64,
            "generation.diverse_init": False,
            "sft.train_capped_turns": False,
            "tree.instances": 8,
            "tree.selections": 4,
            "tree.rollouts": 3,
            "tree.normalizer_instances": 8,
        },
        train_by_trainer={
            "isft": {"iterations": 3},
            "idpo": {"iterations": 2, **_HOTPOTQA_PAIRS},
            "isft-dpo": {"iterations": 2, **_HOTPOTQA_PAIRS},
        },
        eval_instances=100,
        eval_label="the dev set",
        scaling_instances=0,
        caption="HotpotQA is here to show the pipeline on real data, not an effect: at 135M the model "
        "cannot read multi-hop evidence (CoT, with all of it, scores about 0.04 F1), and the trained "
        "systems do not differ from MAD (the line above). It is not retrained on synth-v1's recipe.",
        departures=(
            *_COMMON_DEPARTURES,
            "Data: trained on the first rows of the 200-row train file (the cursor never reaches "
            "dev), evaluated on the first 100 dev rows; the paper's prompt and dealing (the first "
            "sentences of the paragraphs, as the reference loader).",
            "No format-diverse initialization prompts and fewer, shorter samples than the synthetic "
            "task: HotpotQA's prompts are several times longer, so every token costs more.",
            "Preference pairs: theta_dpo-filter -1 and theta_dpo-diff 0.05 (the synthetic task's "
            "recipe, plugins/optima_task_synth) instead of the reference's 0.4 and 0.2, and 16 trees "
            "per iteration: with the reference's thresholds iDPO's first iteration on 8 trees found "
            "no pair (its 96 tree conversations reached a reward of at most 0.29, so no node passed 0.4) "
            "and the model carried over unchanged.",
            "SFT does not train on turns that ran to the 64-token training cap "
            "(sft.train_capped_turns off; they stay as context): their end-of-message marker is the "
            "cap's, not the model's. Half the untrained turns on the first 100 dev rows are longer "
            "than 64 tokens (CoT 55 of 100, SC 394 of 800), and the adapter of the run that trained "
            "on them (before this setting) never learned to stop: on the first 6 dev rows 9 of its 17 "
            "turns ran to the evaluation's 256-token cap and 14 repeated a line (0.017 F1 at 629 "
            "tokens per episode on 79 rows, against MAD's 0.040 at 312). The reference's 2000-token "
            "cap is rarely reached, so it has no such turns to train on.",
            "No inference-scaling figure for HotpotQA (the synthetic task's stands for both).",
        ),
    ),
)
"""The demo's tasks and their settings (``--task`` picks some of them by name)."""

MAIN_TASK: DemoTask = DEMO_TASKS[0]
"""The task of the README's main command (``python -m benchmarks.run``): ``ie/synth-v1``."""
