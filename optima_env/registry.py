"""Plugin manager, task/trainer/recipe registries and ``make``.

Tasks and trainers are found only through pluggy hooks. :func:`get_plugin_manager` builds a fresh
manager (there is no global one): it adds the hookspecs and loads the ``optima`` entry-point group,
through which the built-in task plugins are registered exactly like a third party's.
Set ``OPTIMA_DISABLE_PLUGIN_AUTOLOAD=1`` (or pass ``autoload=False``) to skip entry points, and
``OPTIMA_TRACE_PLUGINS=1`` to log every hook call. An entry point that fails to import or to
register is skipped with one warning naming it and the error; ``OPTIMA_STRICT_PLUGINS=1`` makes
that a :class:`~optima_env.errors.PluginError` (for CI).
"""

from __future__ import annotations

import inspect
import logging
import os
import re
from typing import TYPE_CHECKING, Any

import pluggy

from optima_env import hookspecs
from optima_env.errors import PluginError, UnknownTaskError
from optima_env.specs import TASK_ID_PATTERN, ReadabilitySpec, Recipe, TaskSpec, TrainerSpec

if TYPE_CHECKING:
    from optima_env.conversation_env import ConversationEnv
    from optima_env.task import Task

__all__ = [
    "ReadabilitySpec",
    "Recipe",
    "TaskSpec",
    "TrainerSpec",
    "get_plugin_manager",
    "list_tasks",
    "make",
    "make_parallel",
    "make_task",
    "readability_specs",
    "recipe_specs",
    "resolve_task_id",
    "task_specs",
    "trainer_specs",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "optima"
HOOKSPEC_GROUP = "optima.hookspecs"
"""Entry points naming further hookspec modules (added before the plugins register)."""
_ID_PATTERN = TASK_ID_PATTERN


def get_plugin_manager(*, autoload: bool | None = None, strict: bool | None = None) -> pluggy.PluginManager:
    """Build a fresh plugin manager with the optima hookspecs and the entry-point plugins.

    Args:
        autoload: load the ``optima`` entry-point group. ``None`` means yes unless the environment
            variable ``OPTIMA_DISABLE_PLUGIN_AUTOLOAD`` is set to a non-empty value.
        strict: an entry point that fails to import or to register raises :class:`PluginError`
            instead of being skipped with a warning. ``None`` means yes when the environment
            variable ``OPTIMA_STRICT_PLUGINS`` is set (and not ``0``).

    Raises:
        PluginError: ``strict`` and an entry point failed.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    if autoload is None:
        autoload = not os.environ.get("OPTIMA_DISABLE_PLUGIN_AUTOLOAD")
    if strict is None:
        strict = os.environ.get("OPTIMA_STRICT_PLUGINS", "") not in ("", "0")
    if autoload:
        _add_hookspec_modules(pm, strict=strict)
        _load_entry_points(pm, ENTRY_POINT_GROUP, strict=strict)
    pm.check_pending()
    if os.environ.get("OPTIMA_TRACE_PLUGINS"):
        pm.trace.root.setwriter(lambda msg: logger.info("pluggy: %s", msg.rstrip()))
        pm.enable_tracing()
    return pm


_WARNED_ENTRY_POINTS: set[tuple[str, str]] = set()
"""(entry point, error) pairs already warned about: one warning per process, not per manager."""


def _add_hookspec_modules(pm: pluggy.PluginManager, *, strict: bool) -> None:
    """Add the hookspec modules other packages declare in the ``optima.hookspecs`` entry-point
    group (the trainers' typed training events, :mod:`optima_trainers.hookspecs`), before any plugin
    registers: a plugin implementing them is then checked like any other (a typo still fails it),
    and optima_env imports no other package of its own."""
    import importlib.metadata

    for ep in importlib.metadata.entry_points(group=HOOKSPEC_GROUP):
        try:
            pm.add_hookspecs(ep.load())
        except Exception as exc:  # a broken package must not break every command
            message = f"optima hookspecs entry point '{ep.name} = {ep.value}' failed to load: {exc}"
            if strict:
                raise PluginError(message) from exc
            logger.warning("%s; skipping it", message)


def _load_entry_points(pm: pluggy.PluginManager, group: str, *, strict: bool) -> None:
    """Load and register every entry point of ``group``, isolating each one's failure.

    As pluggy's ``load_setuptools_entrypoints``, except that a plugin that fails to import, to
    register, or implements a hook that does not exist is unregistered and skipped with one
    warning (or raises :class:`PluginError` when ``strict``) instead of breaking every command.
    """
    import importlib.metadata

    for dist in list(importlib.metadata.distributions()):
        for ep in dist.entry_points:
            if ep.group != group or pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
                continue
            where = f"{ep.name} = {ep.value}"
            dist_name = dist.metadata["Name"] if dist.metadata else None
            plugin = None
            try:
                plugin = ep.load()
                pm.register(plugin, name=ep.name)
                pm.check_pending()  # a hook that no spec defines (a typo) fails this plugin only
            except Exception as exc:  # a broken third-party plugin must not break every command
                if plugin is not None and pm.is_registered(plugin):
                    pm.unregister(plugin)
                error = f"{type(exc).__name__}: {exc}"
                message = (
                    f"optima plugin entry point {where!r} (group {group!r}, distribution "
                    f"{dist_name or '?'}) failed to load: {error}"
                )
                if strict:
                    raise PluginError(
                        f"{message}; fix or uninstall that plugin (OPTIMA_STRICT_PLUGINS is set, "
                        "so broken plugins are errors)"
                    ) from exc
                if (where, error) not in _WARNED_ENTRY_POINTS:
                    _WARNED_ENTRY_POINTS.add((where, error))
                    logger.warning(
                        "%s; skipping it (fix or uninstall the plugin; OPTIMA_STRICT_PLUGINS=1 makes "
                        "this an error)",
                        message,
                    )
                continue
            distinfo = getattr(pm, "_plugin_distinfo", None)  # what pluggy's list_plugin_distinfo() reads
            if isinstance(distinfo, list):
                distinfo.append((plugin, dist))


def _collect(
    pm: pluggy.PluginManager, hook_name: str, key: str, kind: type | None = None
) -> dict[Any, tuple[Any, str]]:
    """Call a ``register_*`` hook per plugin and index the results by attribute ``key``, rejecting
    duplicates (and, given ``kind``, anything that is not one)."""
    found: dict[Any, tuple[Any, str]] = {}
    hook = getattr(pm.hook, hook_name)
    for impl in reversed(hook.get_hookimpls()):
        plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)
        specs = impl.function()
        if specs is None:
            continue
        if not isinstance(specs, (list, tuple)):
            raise PluginError(
                f"plugin {plugin_name!r}: {hook_name}() must return a list, got {type(specs).__name__}"
            )
        for spec in specs:
            if kind is not None and not isinstance(spec, kind):
                raise PluginError(
                    f"plugin {plugin_name!r}: {hook_name}() must return {kind.__name__} records, "
                    f"got {type(spec).__name__}"
                )
            name = getattr(spec, key)
            if name in found:
                what, fix = (
                    (str(spec), "drop one of the two recipes or uninstall one plugin")
                    if kind is Recipe
                    else (f"{key} {name!r}", "uninstall or rename one of them")
                )
                raise PluginError(
                    f"{what} is registered twice: by plugin {found[name][1]!r} and by "
                    f"plugin {plugin_name!r}; {fix}"
                )
            found[name] = (spec, plugin_name)
    return found


def task_specs(pm: pluggy.PluginManager | None = None) -> dict[str, TaskSpec]:
    """All registered tasks, by id."""
    pm = pm or get_plugin_manager()
    return {k: v[0] for k, v in sorted(_collect(pm, "optima_register_tasks", "id").items())}


def trainer_specs(pm: pluggy.PluginManager | None = None) -> dict[str, TrainerSpec]:
    """All registered trainer backends, by name."""
    pm = pm or get_plugin_manager()
    return {k: v[0] for k, v in sorted(_collect(pm, "optima_register_trainers", "name").items())}


def recipe_specs(pm: pluggy.PluginManager | None = None) -> dict[tuple[str, str, str], Recipe]:
    """All registered recipes, by ``(task id, trainer name, preset)``."""
    pm = pm or get_plugin_manager()
    return {k: v[0] for k, v in sorted(_collect(pm, "optima_register_recipes", "key", Recipe).items())}


def readability_specs(pm: pluggy.PluginManager | None = None) -> dict[str, ReadabilitySpec]:
    """All registered readability scorers, by name (``transformers`` is built in)."""
    pm = pm or get_plugin_manager()
    return {k: v[0] for k, v in sorted(_collect(pm, "optima_register_readability_scorers", "name").items())}


def list_tasks(pm: pluggy.PluginManager | None = None) -> list[str]:
    """The ids of every registered task, sorted."""
    return list(task_specs(pm))


def _version(task_id: str) -> int:
    match = _ID_PATTERN.match(task_id)
    return int(match.group("v") or 0) if match else 0


def _unversioned(task_id: str) -> str:
    return re.sub(r"-v\d+$", "", task_id)


def resolve_task_id(task_id: str, pm: pluggy.PluginManager | None = None) -> str:
    """Resolve an id, an id without its version (latest wins), or a bare unique name.

    ``"ie/synth-v0"``, ``"ie/synth"`` and ``"synth"`` all resolve to ``"ie/synth-v0"``.

    Raises:
        UnknownTaskError: nothing matches, or a bare name is ambiguous; lists what is registered.
    """
    specs = task_specs(pm)
    if task_id in specs:
        return task_id
    candidates = [i for i in specs if _unversioned(i) == task_id]
    if not candidates:
        candidates = [i for i in specs if _unversioned(i).split("/")[-1] == task_id]
        bases = {_unversioned(i) for i in candidates}
        if len(bases) > 1:
            raise UnknownTaskError(
                f"task name {task_id!r} is ambiguous: it matches {sorted(candidates)}; give the full id"
            )
    if not candidates:
        registered = ", ".join(specs) or "(none)"
        raise UnknownTaskError(
            f"no task {task_id!r}; registered: {registered}. Is the plugin installed "
            "(`pip install -e .` registers the built-in ones through the 'optima' entry points)?"
        )
    return max(candidates, key=_version)


def make_task(task_id: str, *, pm: pluggy.PluginManager | None = None, **kwargs: Any) -> Task:
    """Build the task object of a registered task (no environment around it)."""
    pm = pm or get_plugin_manager()
    resolved = resolve_task_id(task_id, pm)
    spec = task_specs(pm)[resolved]
    task = spec.factory(**{**spec.kwargs, **kwargs})
    task.bind(resolved)
    return task


def make(task_id: str, *, pm: pluggy.PluginManager | None = None, **kwargs: Any) -> ConversationEnv:
    """Build the PettingZoo AEC environment of a registered task.

    Keyword arguments that :class:`~optima_env.conversation_env.ConversationEnv` accepts (``split``,
    ``max_turns``, ``tokenizer``, ``reward_config``, ...) configure the env; the rest go to the
    task's factory (``num_agents``, ``data_dir``, difficulty knobs, ...).
    """
    from optima_env.conversation_env import ConversationEnv

    pm = pm or get_plugin_manager()
    env_params = set(inspect.signature(ConversationEnv.__init__).parameters) - {"self", "task"}
    env_kwargs = {k: v for k, v in kwargs.items() if k in env_params}
    task_kwargs = {k: v for k, v in kwargs.items() if k not in env_params}
    task = make_task(task_id, pm=pm, **task_kwargs)
    return ConversationEnv(task, pm=pm, **env_kwargs)


def make_parallel(task_id: str, *, pm: pluggy.PluginManager | None = None, **kwargs: Any) -> Any:
    """The PettingZoo ``ParallelEnv`` view of a task: ``aec_to_parallel`` over a cycle-aligned env.

    One parallel step is one rotation: every agent speaks once, in order (each agent's utterance
    is seen by the agents after it in the same rotation, as in the AEC env).
    """
    from pettingzoo.utils.conversions import aec_to_parallel

    return aec_to_parallel(make(task_id, pm=pm, cycle_aligned=True, **kwargs))
