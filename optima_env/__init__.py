"""optima_env: PettingZoo environments for LLM multi-agent conversations, scored by the Optima reward.

Public surface::

    import optima_env
    optima_env.list_tasks()                     # registered task ids
    env = optima_env.make("ie/synth-v0")        # a PettingZoo AECEnv
    env.reset(seed=0)

Importing this package never imports torch; model backends import it lazily.
"""

from __future__ import annotations

from optima_env.conversation_env import ConversationEnv
from optima_env.errors import (
    BackendError,
    DataError,
    MissingDependencyError,
    OptimaError,
    PluginError,
    ScoringError,
    TaskContractError,
    UnknownTaskError,
)
from optima_env.hookspecs import hookimpl
from optima_env.registry import (
    ReadabilitySpec,
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
from optima_env.task import Task, agent_names
from optima_env.types import AgentView, Episode, Paragraph, RewardBreakdown, TaskSample, Turn

__version__ = "0.1.0"

__all__ = [
    "AgentView",
    "BackendError",
    "ConversationEnv",
    "DataError",
    "Episode",
    "MissingDependencyError",
    "OptimaError",
    "Paragraph",
    "PluginError",
    "ReadabilitySpec",
    "RewardBreakdown",
    "RewardConfig",
    "ScoringError",
    "Task",
    "TaskContractError",
    "TaskSample",
    "TaskSpec",
    "TrainerSpec",
    "Turn",
    "UnknownTaskError",
    "__version__",
    "agent_names",
    "get_plugin_manager",
    "hookimpl",
    "list_tasks",
    "make",
    "make_parallel",
    "make_task",
    "optima_reward",
    "resolve_task_id",
    "score_group",
]
