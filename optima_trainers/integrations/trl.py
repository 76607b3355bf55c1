"""Any registered optima task under TRL's ``GRPOTrainer``: a rollout function, masks and rewards.

GRPO needs, for each prompt, a group of ``num_generations`` completions with rewards. Here a prompt
names one (instance, agent) of a task (:func:`grpo_prompts`), and :class:`OptimaRollout` (TRL's
``rollout_func``) answers it:

* TRL passes each prompt ``num_generations`` times in a row (one GRPO group); the k-th copy gets
  the k-th of the instance's ``num_generations`` conversations, played with the model being trained (and,
  when given, a frozen policy for the roles that do not train), all with the same env seed, so a
  group is the N samples of one instance on the same dealing of evidence; the conversations of an
  instance are played once per optimizer step and shared by its agents' prompts;
* each conversation becomes one sequence per trained agent, as that agent reads it (its system
  prompt, then every turn; :func:`optima_trainers.sft.data.conversation_messages`): the prompt is
  the system part, the completion the turns, and ``env_mask`` is 1 exactly on the tokens the agent
  wrote (its own turns after the forced ``Name:`` prefix, through the end-of-turn marker) and 0 on
  the other agents' turns and the chat template's text, so GRPO's loss only trains what the model
  generated (:func:`optima_trainers.sft.data.tokenize_with_mask`, the SFT loss mask);
* the group is scored with the Optima reward (``RewardConfig``, the per-instance max token
  normalizer, the frozen base model's readability) and the terms travel to the reward functions
  as extra fields: :func:`reward_functions` gives the total, or task / token / readability as
  separate functions for TRL's multi-objective aggregation (``reward_weights``,
  ``multi_objective_aggregation``).

The ``grpo`` trainer backend (:class:`GRPOBackend`) drives this from the host loop:
``python -m optima_trainers.train --trainer grpo --task ie/synth-v0``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from optima_env.episode_scorer import EpisodeScorer
from optima_env.errors import TaskContractError
from optima_env.policy import ChatPolicy, PerAgentPolicy, SamplingParams, speaker_stops
from optima_env.reward import RewardConfig
from optima_env.rollout import RolloutJob, job_seed, rollout
from optima_env.task import Task
from optima_env.types import Episode
from optima_trainers.sft.data import conversation_messages, tokenize_with_mask

__all__ = ["OptimaRollout", "grpo_prompts", "parse_prompt", "reward_functions", "sequences"]

_PROMPT = re.compile(r"^optima:(?P<task>\S+) instance=(?P<index>\d+) agent=(?P<agent>\S+)$")


def grpo_prompts(task: Task, indices: Sequence[int], agents: Sequence[str] | None = None) -> list[str]:
    """The GRPO dataset's prompts: one per (instance, trained agent)."""
    agents = list(agents or task.agents)
    unknown = set(agents) - set(task.agents)
    if unknown:
        raise TaskContractError(f"agents {sorted(unknown)} are not agents of {task.id} ({list(task.agents)})")
    return [f"optima:{task.id} instance={i} agent={a}" for i in indices for a in agents]


def parse_prompt(prompt: Any) -> tuple[str, int, str]:
    """``(task id, instance index, agent)`` of a prompt made by :func:`grpo_prompts`."""
    match = _PROMPT.match(prompt) if isinstance(prompt, str) else None
    if match is None:
        raise TaskContractError(
            f"expected a prompt made by optima_trainers.integrations.trl.grpo_prompts "
            f"('optima:<task> instance=<i> agent=<name>'), got {prompt!r}; build the dataset with it"
        )
    return match["task"], int(match["index"]), match["agent"]


def sequences(
    episode: Episode,
    agent: str,
    tokenizer: Any,
    *,
    message_format: str = "code",
    max_length: int | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """``(prompt_ids, completion_ids, env_mask)`` of ``episode`` as ``agent`` reads it.

    The prompt is everything before the first turn; ``env_mask`` marks the completion tokens the
    agent wrote. An agent that never spoke gets an all-zero mask (its sequence trains nothing).
    """
    messages, own = conversation_messages(episode, agent, message_format=message_format)  # type: ignore[arg-type]
    system_ids, _ = tokenize_with_mask(tokenizer, messages[:1], [])
    ids, mask = tokenize_with_mask(tokenizer, messages, own, prefixes={i: f"{agent}:" for i in own})
    cut = len(system_ids) if ids[: len(system_ids)] == system_ids else 0
    while cut > 0 and any(mask[:cut]):  # pragma: no cover - the system part never carries loss
        cut -= 1
    prompt, completion, env_mask = ids[:cut], ids[cut:], mask[cut:]
    if max_length is not None and len(completion) > max_length:
        completion, env_mask = completion[:max_length], env_mask[:max_length]
    return prompt, completion, env_mask


class OptimaRollout:
    """TRL's ``rollout_func(prompts, trainer)`` for an optima task (see the module docstring).

    Args:
        task: the task (from :func:`optima_env.make_task`).
        tokenizer: the trained model's tokenizer (renders and counts).
        num_generations: conversations per instance (TRL's ``num_generations``).
        sampling: temperature, top-p, turn cap and stops of the conversations.
        reward: the Optima reward's weights and special cases.
        readability: the frozen base model's per-turn LM loss (``texts -> losses``), or ``None``
            (the readability term is then 0, flagged ``no_readability``).
        frozen: agent -> policy for the roles that do not train (they speak with that policy).
        policy_factory: ``trainer -> ChatPolicy`` of the model being trained (default: TRL's
            current model through :class:`~optima_env.backends.hf.TransformersPolicy`).
        seed: seeds the dealing and sampling (combined with the optimizer step).
        env_kwargs: further :class:`~optima_env.conversation_env.ConversationEnv` options.
        on_scored: called with every scored episode (e.g. the ``optima_episode_scored`` hook).
    """

    # size: the rollout function's settings, keywords with defaults (TRL calls it with fixed arguments)
    def __init__(
        self,
        task: Task,
        *,
        tokenizer: Any,
        num_generations: int,
        sampling: SamplingParams,
        reward: RewardConfig | None = None,
        readability: Callable[[Sequence[str]], Sequence[float]] | None = None,
        frozen: Mapping[str, ChatPolicy] | None = None,
        policy_factory: Callable[[Any], ChatPolicy] | None = None,
        seed: int = 0,
        max_turns: int = 10,
        message_format: str = "code",
        env_kwargs: Mapping[str, Any] | None = None,
        on_scored: Callable[[Episode], None] | None = None,
        max_completion_length: int | None = None,
    ) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.num_generations = num_generations
        self.sampling = sampling
        self.reward = reward or RewardConfig()
        self.readability = readability
        self.frozen = dict(frozen or {})
        self.policy_factory = policy_factory or _current_model_policy
        self.seed = seed
        self.max_turns = max_turns
        self.message_format = message_format
        self.env_kwargs = dict(env_kwargs or {})
        self.on_scored = on_scored
        self.max_completion_length = max_completion_length
        self.episodes: dict[tuple[int, int], list[Episode]] = {}
        """(optimizer step, instance) -> the scored conversations played for it."""

    def play(self, indices: Sequence[int], policy: ChatPolicy, step: int) -> dict[int, list[Episode]]:
        """Play and score ``num_generations`` conversations of each instance (one batch)."""
        speaker = PerAgentPolicy(self.frozen, default=policy) if self.frozen else policy
        seed = zlib.crc32(f"optima-grpo/{self.seed}/{step}".encode()) & 0x7FFFFFFF
        # a group shares its env seed (the same dealing of evidence); the request key tells samples apart
        jobs = [
            RolloutJob(index=i, sample=s, seed=job_seed(seed, i, 0))
            for i in indices
            for s in range(self.num_generations)
        ]
        episodes = rollout(
            self.task,
            speaker,
            jobs=jobs,
            request_key=lambda job, turn: (job.seed, job.sample, turn),
            sampling=self.sampling,
            concurrency=len(indices) * self.num_generations,
            env_kwargs={
                "max_turns": self.max_turns,
                "tokenizer": self.tokenizer,
                "scoring": False,
                **self.env_kwargs,
            },
        )
        # the one scorer: readability, each instance group's max normalizer, the reward, the event
        scorer = EpisodeScorer(self.reward, readability=self.readability, on_scored=self.on_scored)
        scored = scorer.score(episodes)
        n = self.num_generations
        return {index: scored[k * n : (k + 1) * n] for k, index in enumerate(indices)}

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, Any]:
        parsed = [parse_prompt(p) for p in prompts]
        for task_id, _, agent in parsed:
            if task_id != self.task.id or agent not in self.task.agents:
                raise TaskContractError(
                    f"prompt for {task_id}/{agent} given to the rollout of {self.task.id}"
                )
            if agent in self.frozen:
                raise TaskContractError(
                    f"agent {agent!r} is frozen; build the prompts without it (grpo_prompts)"
                )
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0))
        missing = sorted({i for _, i, _ in parsed if (step, i) not in self.episodes})
        if missing:
            self.episodes.update(
                {(step, i): g for i, g in self.play(missing, self.policy_factory(trainer), step).items()}
            )
        out: dict[str, list[Any]] = {
            k: [] for k in ("prompt_ids", "completion_ids", "env_mask", "optima_reward", "optima_task",
                            "optima_token", "optima_readability", "optima_tokens")
        }  # fmt: skip
        seen: dict[tuple[int, str], int] = {}
        for _, index, agent in parsed:  # TRL repeats each prompt num_generations times: one sample each
            k = seen[(index, agent)] = seen.get((index, agent), -1) + 1
            group = self.episodes[(step, index)]
            for episode in (group[k % len(group)],):
                prompt, completion, mask = sequences(
                    episode, agent, self.tokenizer, message_format=self.message_format,
                    max_length=self.max_completion_length,
                )  # fmt: skip
                reward = episode.reward
                assert reward is not None  # scored above
                out["prompt_ids"].append(prompt)
                out["completion_ids"].append(completion)
                out["env_mask"].append(mask)
                out["optima_reward"].append(reward.total)
                out["optima_task"].append(reward.task)
                out["optima_token"].append(reward.token)
                out["optima_readability"].append(reward.readability)
                out["optima_tokens"].append(float(episode.num_tokens))
        return {**out, "logprobs": None}


def _current_model_policy(trainer: Any) -> ChatPolicy:
    from optima_env.backends.hf import TransformersPolicy

    model = trainer.accelerator.unwrap_model(trainer.model)
    return TransformersPolicy(model, trainer.processing_class, batch_size=64, fast=False)


def reward_functions(*, separate_terms: bool = False) -> list[Callable[..., list[float]]]:
    """TRL reward functions reading the Optima reward the rollout computed.

    ``separate_terms=False``: one function, the total (Eq. 1 with the special cases).
    ``separate_terms=True``: ``optima_task``, ``optima_token`` and ``optima_readability`` as three
    functions (weight them with ``GRPOConfig.reward_weights``; TRL logs each one).
    """

    def make(field: str) -> Callable[..., list[float]]:
        def reward(prompts: Any, completions: Any, **kwargs: Any) -> list[float]:
            if field not in kwargs:
                raise TaskContractError(
                    f"reward {field!r} needs the rollout of OptimaRollout (no {field!r} field)"
                )
            return [float(x) for x in kwargs[field]]

        reward.__name__ = field
        return reward

    if separate_terms:
        return [make("optima_task"), make("optima_token"), make("optima_readability")]
    return [make("optima_reward")]


def default_stops(task: Task, enabled: bool) -> tuple[str, ...]:
    """The speaker-tag stop strings of ``task`` when ``enabled``."""
    return speaker_stops(task.agents) if enabled else ()
