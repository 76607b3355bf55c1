"""Every optima task as a verifiers v1 multi-agent environment, evaluated locally.

The task's agents are the environment's roles (``alice``, ``bob``, ...: the agent names in lower
case). :meth:`OptimaEnv.run` plays each conversation with optima's own
:class:`~optima_env.conversation_env.ConversationEnv` (its views, rotation, termination rule,
turn and token caps, the ``"Name:"`` prefix it adds to a reply that lacks it, the task score and
the readability loss), stepping each role with ``agents.<role>.interaction(task)`` and
``await interaction.turn(messages)``. What a role is sent is the env's own
``chat_messages(role)`` in the ``alternating`` format (its turns ``assistant``, everyone else's
``user``): verifiers makes the caller of a turn its user, so the reference code's all-``assistant``
format has no equivalent. A role's trace keeps what its model wrote; the env's transcript (what
the other roles read and what is scored) adds the prefix when the reply lacks it.

:meth:`OptimaEnv.finalize` scores the conversations with :func:`optima_env.reward.score_group` and
records the terms on every role's trace as rewards (``task``, ``token``, ``readability`` and
``penalty``, the ``sft`` impersonation penalty, 0 or -10), so that ``trace.reward`` is the
Optima total; metrics add the total, the conversation's and the role's own token counts, the
normalizer and the LM loss. Every role gets the same reward: the Optima reward is the episode's.

The token normalizer (spec §3) is a per-instance statistic, the max token count over the N
conversations sampled for one instance, but ``finalize`` sees one episode. So an episode plays
``samples`` conversations of its instance (like verifiers' best-of-n env) and, with
``token_normalizer=None``, normalizes by their max (the paper's rule; needs ``samples >= 2``);
the default is a constant ``token_normalizer`` (1000, as :class:`ConversationEnv`), the same for
every episode whatever ``num_rollouts`` is. Independent rollouts of one instance
(``num_rollouts``) never share a normalizer.

Local by default: every role runs the in-process chat harness (:class:`OptimaChatHarness`, one
chat completion per turn through verifiers' interception server) in the ``subprocess`` runtime,
and :func:`local_eval_config` sets the endpoint (any OpenAI-compatible server), turns the
platform push and the dashboard off. Nothing goes to a hosted runtime, endpoint or platform
unless a role's ``runtime``/``client`` or the eval's ``push`` says so.

verifiers finds plugins by importing their id; a dotted module path fails its lookup
(``importlib.util.find_spec("verifiers.v1.tasksets.optima_env.integrations.verifiers")`` raises),
so this module registers itself as the taskset and harness ``optima`` when imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pydantic

from optima_env.errors import TaskContractError, require

vf = require("verifiers.v1", "verifiers")

from verifiers.v1.configs.cli.eval import EvalConfig  # noqa: E402 - after the check above
from verifiers.v1.runtimes.subprocess import SubprocessConfig  # noqa: E402

from optima_env.conversation_env import ConversationEnv  # noqa: E402
from optima_env.integrations._verifiers_chat import PLUGIN_ID, OptimaChatHarness  # noqa: E402
from optima_env.registry import make_task  # noqa: E402
from optima_env.reward import IMPERSONATION_SFT_PENALTY, RewardConfig, score_group  # noqa: E402
from optima_env.rollout import job_seed  # noqa: E402
from optima_env.types import Episode  # noqa: E402

__all__ = [
    "PLUGIN_ID",
    "OptimaChatHarness",
    "OptimaEnv",
    "OptimaEnvConfig",
    "OptimaTask",
    "OptimaTaskData",
    "OptimaTaskset",
    "OptimaTasksetConfig",
    "evaluate",
    "local_eval_config",
    "optima_env_config",
    "role_name",
]


# -- the taskset: one verifiers task per instance of the split ------------------------------------
class OptimaTaskData(vf.TaskData):
    optima_task: str
    """The registered optima task id (``ie/synth-v0``)."""
    split: str
    index: int
    """The instance's position in the split."""


class OptimaTask(vf.Task[OptimaTaskData]):
    @property
    def key(self) -> str:
        return f"{self.data.optima_task}/{self.data.split}/{self.data.index}"


class OptimaTasksetConfig(vf.TasksetConfig):
    id: str = PLUGIN_ID
    optima_task: str = "ie/synth-v0"
    """Which registered optima task to play (``optima_env.list_tasks()``)."""
    task_options: dict[str, Any] = {}
    """Keyword arguments of the task's factory (``{"num_agents": 3}``)."""
    split: str = "test"


class OptimaTaskset(vf.Taskset[OptimaTask, OptimaTasksetConfig]):
    def load(self) -> Iterable[OptimaTask]:
        task_id, split = self.config.optima_task, self.config.split
        for index, sample in enumerate(make_task(task_id, **self.config.task_options).samples(split)):
            data = OptimaTaskData(
                id=sample.id, name=f"{task_id}:{split}:{index}", optima_task=task_id, split=split, index=index
            )
            yield OptimaTask(data, self.config.task)


# -- the environment ------------------------------------------------------------------------------
class OptimaEnvConfig(vf.EnvConfig):
    """The env's knobs; the roles are added per task by :func:`optima_env_config`."""

    taskset: OptimaTasksetConfig = OptimaTasksetConfig()
    max_turns: int = 10
    turn_token_cap: int = 2000
    termination: Literal["repeat", "all_agents"] = "repeat"
    tokenizer: str | None = None
    """Model whose tokenizer counts tokens (``embedded``, a local folder); None: the regex count."""
    readability: str | None = None
    """Frozen base model of the readability term (``embedded``, a local folder); None: term 0."""
    reward_preset: Literal["code", "paper"] = "code"
    lambda_token: float = 0.6
    lambda_loss: float = 1.0
    token_normalizer: float | None = 1000.0
    """Constant token normalizer; None: the max token count over the episode's ``samples``."""
    samples: int = pydantic.Field(1, ge=1)
    """Conversations per episode, all of the episode's instance (the per-instance group)."""
    frozen: list[str] = []
    """Roles whose traces are marked ``trainable = False`` (a fixed partner)."""
    seed: int = 0

    @pydantic.model_validator(mode="after")
    def _check_normalizer(self) -> OptimaEnvConfig:
        if self.token_normalizer is None and self.samples < 2:
            raise ValueError(
                "token_normalizer=None normalizes by the max token count over the episode's "
                f"samples, which needs samples >= 2 (got samples={self.samples}); set samples "
                "(e.g. 4) or a constant token_normalizer"
            )
        if self.token_normalizer is not None and not self.token_normalizer > 0:
            raise ValueError(f"token_normalizer must be > 0 or None, got {self.token_normalizer!r}")
        return self

    def reward_config(self) -> RewardConfig:
        return RewardConfig.preset(
            self.reward_preset, lambda_token=self.lambda_token, lambda_loss=self.lambda_loss
        )


def role_name(agent: str) -> str:
    """The verifiers role of an optima agent: its name in lower case (``Alice`` -> ``alice``)."""
    role = agent.lower()
    if not role.isidentifier() or role in OptimaEnvConfig.model_fields:
        raise TaskContractError(
            f"agent {agent!r} cannot be a verifiers role: {role!r} must be an identifier that is "
            f"not an env setting ({sorted(OptimaEnvConfig.model_fields)})"
        )
    return role


def local_agent() -> Any:
    """A role's default: this module's chat harness in the local ``subprocess`` runtime."""
    return vf.AgentConfig(harness={"id": PLUGIN_ID}, runtime=SubprocessConfig())


@functools.cache
def _config_class(agents: tuple[str, ...]) -> type[OptimaEnvConfig]:
    roles: dict[str, Any] = {role_name(a): (vf.AgentConfig, local_agent()) for a in agents}
    name = "OptimaEnvConfig_" + "_".join(agents)
    return pydantic.create_model(name, __base__=OptimaEnvConfig, __module__=__name__, **roles)


def optima_env_config(
    optima_task: str = "ie/synth-v0",
    *,
    split: str = "test",
    task_options: Mapping[str, Any] | None = None,
    **settings: Any,
) -> Any:
    """The env config of one optima task (built with ``task_options``): its agents as roles (each
    a local chat agent unless ``settings`` give ``bob={"model": ..., "client": ...}``) and the
    env's knobs (:class:`OptimaEnvConfig`)."""
    options = dict(task_options or {})
    agents = tuple(make_task(optima_task, **options).agents)
    taskset = OptimaTasksetConfig(optima_task=optima_task, split=split, task_options=options)
    return _config_class(agents).model_validate({"taskset": taskset, **settings})


class OptimaEnv(vf.Env[OptimaEnvConfig]):
    """Plays an optima task's conversations and scores them with the Optima reward."""

    def __init__(self, config: OptimaEnvConfig) -> None:
        super().__init__(config)
        self.optima = make_task(config.taskset.optima_task, **config.taskset.task_options)
        self.roles = {agent: role_name(agent) for agent in self.optima.agents}
        declared = set(self._agent_specs)
        if declared != set(self.roles.values()):
            raise TaskContractError(
                f"task {self.optima.id!r} has the roles {sorted(self.roles.values())} but the config "
                f"declares {sorted(declared)}; build it with optima_env_config({self.optima.id!r})"
            )
        unknown = sorted(set(config.frozen) - declared)
        if unknown:
            raise TaskContractError(f"frozen names unknown roles {unknown}; the roles are {sorted(declared)}")
        self._tokenizer = _tokenizer(config.tokenizer) if config.tokenizer else None
        self._readability = _readability(config.readability) if config.readability else None
        self._played: dict[str, tuple[int, Episode]] = {}  # trace id -> (sample, conversation)

    async def setup(self, agents: Any) -> None:
        for role in self.config.frozen:
            getattr(agents, role).trainable = False

    def conversation_env(self, split: str) -> ConversationEnv:
        """A fresh optima env with this config's rules (alternating messages, scored later)."""
        cfg = self.config
        return ConversationEnv(
            self.optima,
            split=split,
            max_turns=cfg.max_turns,
            turn_token_cap=cfg.turn_token_cap,
            tokenizer=self._tokenizer,
            readability=self._readability,
            termination=cfg.termination,
            message_format="alternating",
            scoring=False,
        )

    async def run(self, task: OptimaTask, agents: Any) -> None:
        played: list[str] = []
        try:
            for sample in range(self.config.samples):
                played += await self._play(task, agents, sample)
        except BaseException:
            for trace_id in played:  # the episode failed: finalize will not collect them
                self._played.pop(trace_id, None)
            raise

    async def _play(self, task: OptimaTask, agents: Any, sample: int) -> list[str]:
        """One conversation of the episode's instance; returns its traces' ids."""
        env = self.conversation_env(task.data.split)
        seed = job_seed(self.config.seed, task.data.index, sample)
        await asyncio.to_thread(env.reset, seed=seed, options={"index": task.data.index})
        first = env.possible_agents[0]
        async with contextlib.AsyncExitStack() as stack:
            chats = {}
            for agent, role in self.roles.items():
                system = env.chat_messages(agent)[0]["content"]
                data = task.data.model_copy(
                    update={"system_prompt": system, "prompt": [] if agent == first else None}
                )
                chats[agent] = await stack.enter_async_context(
                    getattr(agents, role).interaction(OptimaTask(data, task.config))
                )
            seen = dict.fromkeys(self.roles, 1)  # messages each role has: its system prompt
            while env.episode is None:
                agent = env.agent_selection
                messages = env.chat_messages(agent)
                new = [m for m in messages[seen[agent] :] if m["role"] == "user"]
                segment = await (chats[agent].turn(new) if new else chats[agent].turn())
                if segment.terminated:
                    raise _stopped(self.roles[agent], len(env.turns), chats[agent].trace)
                await asyncio.to_thread(env.step, segment.last_reply)
                seen[agent] = len(env.chat_messages(agent))
        for chat in chats.values():
            self._played[chat.trace.id] = (sample, env.episode)
        return [chat.trace.id for chat in chats.values()]

    async def finalize(self, task: OptimaTask, episode: Any) -> None:
        played = {t.id: self._played.pop(t.id) for t in episode.traces if t.id in self._played}
        if len(played) != len(episode.traces):
            raise TaskContractError(
                f"{len(episode.traces) - len(played)} of the episode's traces have no optima conversation"
            )
        conversations = {sample: ep for sample, ep in played.values()}
        scored = score_group(
            [conversations[k] for k in sorted(conversations)],
            config=self.config.reward_config(),
            normalizer=self.config.token_normalizer,
        )
        by_sample = dict(zip(sorted(conversations), scored))
        for trace in episode.traces:
            sample, _ = played[trace.id]
            record_reward(trace, by_sample[sample], sample=sample, role=trace.agent.name, roles=self.roles)


def _stopped(role: str, turns: int, trace: Any) -> TaskContractError:
    last = trace.errors[-1] if trace.errors else None
    cause = f"{last.type}: {last.message}" if last else "no error: a max_turns or token limit"
    return TaskContractError(
        f"role {role!r} stopped answering after {turns} turns (its verifiers run ended: "
        f"{trace.stop_condition}; {cause}); the optima conversation needs a reply every turn: fix "
        "the endpoint or lift the role's max_turns/token limits"
    )


def record_reward(trace: Any, episode: Episode, *, sample: int, role: str, roles: Mapping[str, str]) -> None:
    """The Optima reward of ``episode`` on ``role``'s trace: terms as rewards (summing to the
    total), counts as metrics, the conversation in ``trace.info["optima"]``."""
    reward = episode.reward
    if reward is None:  # pragma: no cover - score_group always fills it
        raise TaskContractError("internal error: the conversation was not scored")
    penalty = -IMPERSONATION_SFT_PENALTY if "impersonation_sft" in reward.flags else 0.0
    for name, value in (
        ("task", reward.task),
        ("token", reward.token),
        ("readability", reward.readability),
        ("penalty", penalty),
    ):
        trace.record_reward(name, value)
    agent = next(a for a, r in roles.items() if r == role)
    own = [t for t in episode.turns if t.agent == agent]
    trace.record_metrics(
        {
            "optima_total": reward.total,
            "optima_num_tokens": reward.num_tokens,
            "optima_normalizer": reward.normalizer,
            "optima_role_tokens": sum(t.num_tokens for t in own),
            "optima_role_turns": len(own),
            "optima_turns": len(episode.turns),
            "optima_terminated": float(episode.terminated),
        }
    )
    if reward.lm_loss is not None:
        trace.record_metric("optima_lm_loss", reward.lm_loss)
    trace.info["optima"] = {
        "sample": sample,
        "seed": episode.seed,
        "end_reason": episode.end_reason,
        "final_answer": episode.final_answer,
        "turns": [{"agent": t.agent, "text": t.text, "num_tokens": t.num_tokens} for t in episode.turns],
        "flags": list(reward.flags),
    }


@functools.cache
def _tokenizer(name: str) -> Any:
    from optima_env.models import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path(name))


@functools.cache
def _readability(name: str) -> Any:
    from optima_env.readability import TransformersLMLoss

    return TransformersLMLoss.from_pretrained(name)


# -- a local evaluation ---------------------------------------------------------------------------
# size: verifiers' evaluation settings, each a keyword with a local default
def local_eval_config(
    env: Any,
    *,
    base_url: str,
    model: str,
    output_dir: str | Path,
    num_instances: int | None = None,
    num_rollouts: int = 1,
    sampling: Mapping[str, Any] | None = None,
    api_key_var: str = "OPENAI_API_KEY",
    max_concurrent: int = 4,
) -> Any:
    """A verifiers ``EvalConfig`` that stays on this machine: the model at ``base_url`` (any
    OpenAI-compatible server; the key, if any, in ``$api_key_var``), no platform push, no
    dashboard, traces under ``output_dir``. ``env`` comes from :func:`optima_env_config`.

    More than 8 parameters: they are ``EvalConfig``'s own fields, keyword-only, all but the
    endpoint, model and folder with defaults.
    """
    if not isinstance(env, OptimaEnvConfig):
        raise TaskContractError(f"env must come from optima_env_config(...), got {type(env).__name__}")
    return EvalConfig(
        env=env,
        model=model,
        client=vf.EvalClientConfig(base_url=base_url, api_key_var=api_key_var),
        sampling=vf.SamplingConfig(**(sampling or {})),
        select={"limit": num_instances},
        num_rollouts=num_rollouts,
        max_concurrent=max_concurrent,
        push=False,
        rich=None,
        output_dir=Path(output_dir),
    )


def evaluate(config: Any) -> list[Any]:
    """Run a verifiers evaluation (``verifiers.v1.cli.eval.runner.run_eval``) to its end; returns
    its episodes (also in ``<output_dir>/<run name>/traces.jsonl``)."""
    from verifiers.v1.cli.eval.runner import run_eval

    return asyncio.run(run_eval(config))


def _register(names: Sequence[str]) -> None:
    module = sys.modules[__name__]
    for name in names:
        sys.modules.setdefault(name, module)


_register([f"verifiers.v1.tasksets.{PLUGIN_ID}", f"verifiers.v1.harnesses.{PLUGIN_ID}"])
