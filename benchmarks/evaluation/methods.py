"""The methods of the benchmark table: baselines, trained checkpoints and inference scaling.

Every method plays a task through the same machinery: it wraps the task (its prompts and number
of agents), says how many conversations to sample per instance and how, and reduces one
instance's episodes to a score and a token count. The episodes themselves come from the batched
engine (:func:`optima_env.rollout.rollout`) and the conversation env, so every method's tokens are
counted by the same tokenizer and every episode carries the same reward breakdown.

=================  ================================================================================
method             what it plays
=================  ================================================================================
``cot``            one agent, greedy, one turn; for information exchange it sees the evidence of
                   all agents (spec §13 item 19: the paper leaves this unspecified)
``sc``             ``n`` CoT samples at temperature > 0; information exchange: answers clustered
                   by pairwise F1 > 0.9, score = mean F1 of the largest group's members (spec §8.2);
                   otherwise majority vote by exact answer string; tokens = sum over the samples
``mad``            the untrained multi-agent system, greedy, with natural-language prompts
``autoform``       the same multi-agent system, told to use concise non-natural-language formats
``ckpt:<NAME>``    a trained checkpoint as the multi-agent system with the task's own prompts, greedy
                   (a local folder's key ends in ``@`` and its content digest: :func:`checkpoint_key`)
``scaling:<m>``    ``K`` samples of method ``m`` at temperature 0.5; per k = 1..K the majority vote
                   (F1 >= 0.9 for information exchange, exact match otherwise), the coverage (best
                   of k) and the total tokens (spec §8.3)
=================  ================================================================================

Single-agent episodes are played by :class:`SingleAgentTask`, a one-agent view of the task in the
same env with ``max_turns=1`` (so their ``end_reason`` is ``max_turns``). MAD and AutoForm use the
prompts of :mod:`benchmarks.evaluation.prompts`; a task may supply its own variants by defining
``styled_views(sample, *, rng, style)`` (``style`` is ``"natural"`` or ``"autoform"``) returning the
views, or ``None`` to use ours. Abstaining samples (no answer) do not vote.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.evaluation.wrappers import OneHandTask, SingleAgentTask, StyledTask, SwappedEvidence
from optima_env.backends.peft_adapter import content_hash
from optima_env.errors import TaskContractError
from optima_env.policy import SamplingParams
from optima_env.scoring import f1, majority_vote
from optima_env.task import Task
from optima_env.types import Episode

__all__ = [
    "BASE_METHODS",
    "CONTROL_METHODS",
    "Method",
    "OneHandTask",
    "PlaySettings",
    "SingleAgentTask",
    "StyledTask",
    "SwappedEvidence",
    "build_methods",
    "checkpoint_key",
    "counterfactual",
    "scaling_curve",
    "vote",
    "with_controls",
]

BASE_METHODS = ("cot", "sc", "mad", "autoform", "one-hand")
"""Method names accepted by ``--methods`` (checkpoints come from ``--checkpoint``)."""
CONTROL_METHODS = ("one-hand",)
"""The baselines that are controls (a shortcut's reach, not a system to beat)."""


@dataclass(frozen=True, kw_only=True)
class PlaySettings:
    """Generation settings shared by the methods of one run."""

    max_turns: int
    max_new_tokens: int
    temperature: float = 0.0
    """Temperature of the one-sample methods (0 = greedy, as the paper evaluates)."""
    sc_n: int = 8
    sc_temperature: float = 0.7
    scaling_k: int = 8
    scaling_temperature: float = 0.5
    seed: int = 0
    stop_at_speaker_tags: bool = False
    """Cut a turn where it starts writing an agent's ``"Name:"`` tag (as the trainers' cpu profile)."""


# -- voting ---------------------------------------------------------------------------------------
def _same_string(a: str, b: str) -> float:
    return float(a.strip() == b.strip())


def vote(task: Task, episodes: Sequence[Episode], *, strict: bool) -> float:
    """Self-consistency score of one instance's samples.

    Information exchange: answers grouped by pairwise F1 (``> 0.9`` when ``strict``, else
    ``>= 0.9``); other tasks: by exact answer string. The score is the mean task score of the
    largest group's members (ties: the earliest group). Samples without an answer do not vote;
    when no sample answered, the score is the mean of their own scores (the task's no-answer score).
    """
    if not episodes:
        raise TaskContractError("vote needs at least one episode")
    voting = [e for e in episodes if e.final_answer is not None]
    if not voting:
        return statistics.fmean(e.task_score for e in episodes)
    similarity = f1 if task.family == "information_exchange" else _same_string
    _, group = majority_vote([e.final_answer for e in voting], similarity=similarity, strict=strict)
    return statistics.fmean(voting[i].task_score for i in group)


def scaling_curve(task: Task, episodes: Sequence[Episode]) -> list[dict[str, float]]:
    """Per k = 1..len(episodes): majority-vote score, coverage and total tokens of the first k."""
    curve = []
    for k in range(1, len(episodes) + 1):
        first = episodes[:k]
        curve.append(
            {
                "k": k,
                "score": vote(task, first, strict=False),
                "coverage": max(e.task_score for e in first),
                "tokens": float(sum(e.num_tokens for e in first)),
            }
        )
    return curve


# -- methods --------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Method:
    """One row of the table.

    Attributes:
        key: unique id in a run (part of every episode's unit key).
        label: the row label.
        agents: ``single`` (CoT prompt, one agent), ``one_hand`` (CoT prompt, the final-hop
            holder's evidence only) or ``multi`` (the task's agents).
        style: ``natural`` (MAD), ``autoform``, or ``None`` for the task's own prompts.
        samples: conversations per instance.
        temperature: sampling temperature.
        aggregate: ``first`` (the one sample), ``vote`` (SC, strict F1 > 0.9) or ``scaling``.
        model: the model that plays (``None``: the run's ``--model``).
        swapped: the counterfactual: the first agent's evidence is another instance's.
    """

    key: str
    label: str
    agents: str
    style: str | None
    samples: int
    temperature: float
    aggregate: str = "first"
    model: str | None = None
    swapped: bool = False

    @property
    def prompts(self) -> str:
        """What the agents are told, in words (for the report)."""
        if self.agents == "single":
            return "one agent, CoT prompt with every agent's evidence"
        if self.agents == "one_hand":
            return "one agent, CoT prompt with only the final-hop holder's evidence"
        if self.swapped:
            return "the task's agents and own prompts; the first agent holds another instance's evidence"
        if self.style == "natural":
            return "the task's agents, natural-language prompts"
        if self.style == "autoform":
            return "the task's agents, AutoForm prompts (concise non-natural-language formats)"
        return "the task's agents and own prompts"

    def play_task(self, task: Task) -> Task:
        """The task as this method plays it."""
        if self.agents == "single":
            return SingleAgentTask(task)
        if self.agents == "one_hand":
            return OneHandTask(task)
        if self.swapped:
            task = SwappedEvidence(task)
        return StyledTask(task, self.style) if self.style else task

    def max_turns(self, settings: PlaySettings) -> int:
        return 1 if self.agents in ("single", "one_hand") else settings.max_turns

    def sampling(self, settings: PlaySettings) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, max_new_tokens=settings.max_new_tokens, seed=settings.seed
        )

    def reduce(self, task: Task, episodes: Sequence[Episode]) -> dict[str, object]:
        """One instance's ``score`` and ``tokens`` (plus ``curve`` and ``coverage`` for scaling)."""
        tokens = float(sum(e.num_tokens for e in episodes))
        if self.aggregate == "first":
            return {"score": episodes[0].task_score, "tokens": tokens}
        if self.aggregate == "vote":
            return {"score": vote(task, episodes, strict=True), "tokens": tokens}
        curve = scaling_curve(task, episodes)
        return {
            "score": curve[-1]["score"],
            "coverage": curve[-1]["coverage"],
            "tokens": tokens,
            "curve": curve,
        }


def _base(name: str, s: PlaySettings) -> Method:
    if name == "cot":
        return Method(
            key="cot", label="CoT", agents="single", style=None, samples=1, temperature=s.temperature
        )
    if name == "sc":
        return Method(
            key="sc",
            label=f"SC (n={s.sc_n})",
            agents="single",
            style=None,
            samples=s.sc_n,
            temperature=s.sc_temperature,
            aggregate="vote",
        )
    if name == "mad":
        return Method(
            key="mad", label="MAD", agents="multi", style="natural", samples=1, temperature=s.temperature
        )
    if name == "one-hand":
        return Method(
            key="one_hand", label="One hand (final-hop holder alone)", agents="one_hand", style=None,
            samples=1, temperature=s.temperature,
        )  # fmt: skip
    if name == "autoform":
        return Method(
            key="autoform",
            label="AutoForm",
            agents="multi",
            style="autoform",
            samples=1,
            temperature=s.temperature,
        )
    raise TaskContractError(f"unknown method {name!r}; expected one of {', '.join(BASE_METHODS)}")


def counterfactual(method: Method) -> Method:
    """``method`` with its first agent's evidence from another instance (a multi-agent method)."""
    if method.agents != "multi" or method.swapped:
        raise TaskContractError(
            f"the counterfactual swaps the first agent's evidence of a multi-agent system; {method.label!r} "
            f"is {'one already' if method.swapped else 'a single agent'}"
        )
    return dataclasses.replace(
        method, key=f"cf:{method.key}", label=f"{method.label} (counterfactual)", swapped=True
    )


def with_controls(methods: Sequence[Method], settings: PlaySettings) -> list[Method]:
    """``methods`` with the controls (:mod:`benchmarks.evaluation.controls`): the one-hand row after
    the baselines, and each checkpoint's counterfactual after the checkpoints."""
    baselines = [m for m in methods if m.model is None]
    systems = [m for m in methods if m.model is not None]
    one_hand = [] if any(m.key == "one_hand" for m in baselines) else [_base("one-hand", settings)]
    return [*baselines, *one_hand, *systems, *(counterfactual(m) for m in systems)]


def checkpoint_key(name: str, path: str) -> str:
    """The unit-key id of checkpoint ``name`` at ``path``: ``ckpt:<name>@<digest>``, the first 12
    hex digits of the folder's content hash (:func:`optima_env.backends.peft_adapter.content_hash`:
    its files, and an adapter's base). A checkpoint retrained or re-exported into the same folder
    gets a new key, so a resumed run plays it again instead of reporting the old model's episodes.
    A model that is not a local folder (a hub name, ``embedded``, ``scripted``) is ``ckpt:<name>``."""
    if not Path(path).is_dir():
        return f"ckpt:{name}"
    return f"ckpt:{name}@{content_hash(path)[:12]}"


def build_methods(
    names: Sequence[str],
    checkpoints: Mapping[str, str],
    settings: PlaySettings,
    *,
    scaling: bool = False,
    keys: Mapping[str, str] | None = None,
) -> list[Method]:
    """The methods of a run, in table order: the named baselines, then one per checkpoint.

    ``keys`` gives the unit key of a checkpoint whose key is known already (a run's recorded stage,
    whose folder may no longer hold the weights): it is not hashed again (:func:`checkpoint_key`).

    With ``scaling`` every method becomes its inference-scaling variant (``scaling_k`` samples at
    ``scaling_temperature``); ``sc`` is then redundant with ``scaling:cot`` and is rejected.
    """
    methods = [_base(n, settings) for n in names]
    for name, path in checkpoints.items():
        methods.append(
            Method(
                key=(keys or {}).get(name) or checkpoint_key(name, path),
                label=name,
                agents="multi",
                style=None,
                samples=1,
                temperature=settings.temperature,
                model=path,
            )
        )
    if scaling:
        if any(m.key == "sc" for m in methods):
            raise TaskContractError(
                "the scaling suite samples every method already; drop 'sc' from --methods"
            )
        methods = [
            dataclasses.replace(
                m,
                key=f"scaling:{m.key}",
                label=f"{m.label} (k≤{settings.scaling_k}, T={settings.scaling_temperature})",
                samples=settings.scaling_k,
                temperature=settings.scaling_temperature,
                aggregate="scaling",
            )
            for m in methods
        ]
    keys = [m.key for m in methods]
    if len(set(keys)) != len(keys):
        raise TaskContractError(f"two methods share a key: {keys}; give checkpoints distinct names")
    return methods
