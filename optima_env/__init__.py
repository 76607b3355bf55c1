"""optima_env: PettingZoo environments for LLM multi-agent conversations, scored by the Optima reward.

Public surface (everything the README and ``examples/`` use is importable from here)::

    import optima_env
    optima_env.list_tasks()                     # registered task ids
    env = optima_env.make("ie/synth-v0")        # a PettingZoo AECEnv
    env.reset(seed=0)

    from optima_env import SamplingParams, TransformersPolicy, make_jobs, make_task, rollout
    episodes = rollout(make_task("ie/synth-v0"), TransformersPolicy.from_pretrained("embedded"),
                       jobs=make_jobs(range(8), num_samples=2, seed=0), sampling=SamplingParams())

Importing this package never imports torch; model backends import it lazily, and the backend
classes (``TransformersPolicy``, ``VLLMPolicy``, ``OpenAIChatPolicy``, ``load_policy``) are
attributes resolved on first use.

A task plugin's conformance checks run from the shell with ``python -m optima_env.check TASK``
(:mod:`optima_env.check`, one line per check of :func:`~optima_env.testing.check_task`).

``optima_env.rollout`` is the :func:`~optima_env.rollout.rollout` function (the package attribute
shadows its module); ``from optima_env.rollout import make_jobs`` still imports from the module.

Subpackages are layers: each imports only the ones before it in this order (bottom first;
``tests/test_layers.py`` checks every import against it)::

    scoring → datasets → families → backends → integrations

* :mod:`optima_env.scoring`: answer scorers (token F1, exact match, numbers, choices);
* :mod:`optima_env.datasets`: the dataset loaders and the embedded synthetic data;
* :mod:`optima_env.families`: the task families (information exchange, debate) on both;
* :mod:`optima_env.backends`: the model backends (transformers, vLLM, OpenAI-compatible servers);
* :mod:`optima_env.integrations`: adapters to other frameworks.

The top-level modules are the core (records, errors, the task contract, the env, rollouts, the
reward, the registry and hookspecs): every layer may import them, and of the layers they import
only ``families`` (the env's and the rules' family behaviour) and ``scoring`` (re-exported here).
No module imports torch when it is imported (checked by the same test file).
"""

from __future__ import annotations

from typing import Any

from optima_env.conversation_env import ConversationEnv
from optima_env.episode_scorer import EpisodeScorer
from optima_env.errors import (
    BackendError,
    ConfigError,
    CorruptCheckpointError,
    DataError,
    EnvNotResetError,
    EpisodeOverError,
    MissingDependencyError,
    OptimaError,
    PluginError,
    RolloutError,
    RunConfigError,
    ScoringError,
    TaskContractError,
    UnknownTaskError,
)
from optima_env.hookspecs import hookimpl
from optima_env.io import read_episodes, write_episodes, write_json_atomic, write_text_atomic
from optima_env.models import load_model
from optima_env.policy import (
    ChatPolicy,
    GenerationRequest,
    PerAgentPolicy,
    SamplingParams,
    ScriptedPolicy,
    TurnEngine,
)
from optima_env.prompts import INFORMATION_EXCHANGE_PROMPT, PEER_DEBATE_PROMPT, join_names, render
from optima_env.readability import TransformersLMLoss
from optima_env.registry import (
    ReadabilitySpec,
    Recipe,
    TaskSpec,
    TrainerSpec,
    get_plugin_manager,
    list_tasks,
    make,
    make_parallel,
    make_task,
    resolve_task_id,
)
from optima_env.reward import RewardConfig, optima_reward, score_group
from optima_env.rollout import RolloutJob, make_jobs, rollout, run_episode
from optima_env.scoring import extract_tagged, f1
from optima_env.task import Task, agent_names
from optima_env.testing import CheckReport, check_task
from optima_env.turns import BatchTurns
from optima_env.types import AgentView, Episode, Paragraph, RewardBreakdown, TaskSample, Turn

__version__ = "0.1.0"

__all__ = [
    "INFORMATION_EXCHANGE_PROMPT",
    "PEER_DEBATE_PROMPT",
    "AgentView",
    "BackendError",
    "BatchTurns",
    "ChatPolicy",
    "CheckReport",
    "ConfigError",
    "ConversationEnv",
    "CorruptCheckpointError",
    "DataError",
    "EnvNotResetError",
    "Episode",
    "EpisodeOverError",
    "EpisodeScorer",
    "GenerationRequest",
    "MissingDependencyError",
    "OpenAIChatPolicy",
    "OptimaError",
    "Paragraph",
    "PerAgentPolicy",
    "PluginError",
    "ReadabilitySpec",
    "Recipe",
    "RewardBreakdown",
    "RewardConfig",
    "RolloutError",
    "RolloutJob",
    "RunConfigError",
    "SamplingParams",
    "ScoringError",
    "ScriptedPolicy",
    "Task",
    "TaskContractError",
    "TaskSample",
    "TaskSpec",
    "TrainerSpec",
    "TransformersLMLoss",
    "TransformersPolicy",
    "Turn",
    "TurnEngine",
    "UnknownTaskError",
    "VLLMPolicy",
    "__version__",
    "agent_names",
    "check_task",
    "extract_tagged",
    "f1",
    "get_plugin_manager",
    "hookimpl",
    "join_names",
    "list_tasks",
    "load_model",
    "load_policy",
    "make",
    "make_jobs",
    "make_parallel",
    "make_task",
    "optima_reward",
    "read_episodes",
    "render",
    "resolve_task_id",
    "rollout",
    "run_episode",
    "score_group",
    "write_episodes",
    "write_json_atomic",
    "write_text_atomic",
]

_LAZY = {  # the generation engines: their modules are light, but each one is an engine choice
    "TransformersPolicy": "optima_env.backends.hf",
    "VLLMPolicy": "optima_env.backends.vllm",
    "OpenAIChatPolicy": "optima_env.backends.openai",
    "load_policy": "optima_env.backends.loading",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'optima_env' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
