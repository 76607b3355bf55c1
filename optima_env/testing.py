"""Conformance checks for task plugins: run :func:`check_task` on a task before publishing it.

::

    from optima_env.testing import check_task

    check_task("ie/my-task-v0")                                # a registered id
    check_task(MyTask(), split="train")                        # or a task object
    check_task("ie/hotpotqa-v0", task_kwargs={"data_dir": "data/"})

Each check raises :class:`~optima_env.errors.TaskContractError` naming the task, the check and
what was wrong; a clean run returns a :class:`CheckReport` listing what was checked:

``agents``        a non-empty tuple of distinct, non-empty names
``samples``       the split has instances, each a :class:`~optima_env.types.TaskSample` with answers
``views``         one view per agent, non-empty prompts, the same rng seed gives the same views
``formats``       without a format the prompt is the base prompt; with pool format ``k`` the base
                  prompt is exactly the prompt without it, and some agent's prompt differs
``evidence``      an information-exchange task declares the evidence it deals (``AgentView.private``
                  of some agent, each unit shown in that agent's prompt): what the baselines see
``extract``       ``extract_answer`` returns ``str | None`` on junk text and never raises
``score``         every score is a number in [0, 1] (for ``None``, junk and gold); the gold
                  answer scores 1 (and, with ``answer_text``, a turn carrying it, once extracted)
``episode_seed``  the same seed and a scripted policy give the same :class:`Episode`, which
                  round-trips through JSON
``api_test``      PettingZoo's ``api_test``, ``seed_test`` and ``parallel_api_test`` (through
                  ``aec_to_parallel`` of the ``cycle_aligned`` env)
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from optima_env.conversation_env import ConversationEnv
from optima_env.errors import TaskContractError
from optima_env.policy import GenerationRequest, ScriptedPolicy
from optima_env.registry import make_task
from optima_env.rollout import run_episode
from optima_env.task import Task, needs_evidence, require_evidence
from optima_env.types import AgentView, Episode, TaskSample

if TYPE_CHECKING:
    import pluggy

__all__ = ["JUNK_TEXTS", "CheckReport", "check_task"]

JUNK_TEXTS: tuple[str, ...] = (
    "",
    "   ",
    "Alice:",
    "<A>",
    "</A>",
    "<A></A>",
    "<A>   </A>",
    "<A>unclosed",
    "<A>two\nlines</A>",
    "<A><A>nested</A></A>",
    "\\boxed{",
    "\\boxed{}",
    "\\boxed{{}",
    "\\boxed{\\boxed{}}",
    "}{",
    "$$",
    "\\frac{1}{0}",
    "1/0",
    "nan",
    "-inf",
    "日本語 ✓ 🙂",
    "\x00\x01\x7f",
    "<A>" * 500,
    "\\boxed{" * 500,
    "x" * 20_000,
)
"""Texts :func:`check_task` feeds to ``extract_answer`` and (extracted) to ``score``."""

_SCRIPT = ("thinking it over", "<A>42</A> \\boxed{42}", "<A>42</A> \\boxed{42}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckReport:
    """What :func:`check_task` checked on one task (every check passed)."""

    task_id: str
    split: str
    samples_checked: int
    formats_checked: int
    checks: tuple[str, ...]


# size: check_task's switches (which checks, sizes, seeds), keyword options with defaults
def check_task(
    task_or_id: Task | str,
    *,
    pm: pluggy.PluginManager | None = None,
    split: str = "test",
    task_kwargs: Mapping[str, Any] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    num_samples: int = 3,
    seeds: Sequence[int] = (0, 1),
    api_cycles: int = 20,
    answer_text: Callable[[TaskSample], str] | None = None,
    on_pass: Callable[[str, str], None] | None = None,
) -> CheckReport:
    """Run the conformance checks (module docstring) on one task.

    Args:
        task_or_id: a task object, or a registered id (built with ``task_kwargs``).
        pm: the plugin manager that resolves the id (default: a fresh one).
        split: the split whose instances are checked and played.
        task_kwargs: factory arguments when ``task_or_id`` is an id (e.g. ``data_dir``).
        env_kwargs: extra :class:`~optima_env.conversation_env.ConversationEnv` arguments.
        num_samples: instances whose views, formats and scores are checked.
        seeds: seeds of the episode reproducibility check.
        api_cycles: ``num_cycles`` of PettingZoo's tests.
        answer_text: optional ``sample -> turn text`` giving a turn that carries the gold answer
            in the task's format; its extracted answer must score 1.
        on_pass: called as ``on_pass(check, detail)`` when a check passes, and once per PettingZoo
            suite under ``api_test`` (``python -m optima_env.check`` prints a line each).

    Returns:
        A :class:`CheckReport`.

    Raises:
        TaskContractError: the first check that fails, with what was expected and what was got.
    """
    if isinstance(task_or_id, Task):
        if task_kwargs:
            raise TaskContractError("task_kwargs only apply when check_task is given a task id")
        task = task_or_id
    else:
        task = make_task(task_or_id, pm=pm, **dict(task_kwargs or {}))
    checks: list[str] = []

    def fail(check: str, message: str) -> TaskContractError:
        return TaskContractError(f"task {task.id!r} fails check {check!r}: {message}")

    def passed(check: str, detail: str = "") -> None:
        if check not in checks:
            checks.append(check)
        if on_pass is not None:
            on_pass(check, detail)

    _check_agents(task, fail)
    passed("agents", ", ".join(task.agents))
    samples = task.samples(split)
    if len(samples) == 0:
        raise fail("samples", f"split {split!r} has no instances")
    picked = [samples[i] for i in range(min(num_samples, len(samples)))]
    for sample in picked:
        if not isinstance(sample, TaskSample) or not sample.answers:
            raise fail("samples", f"expected TaskSamples with at least one answer, got {sample!r:.200}")
    passed("samples", f"{len(picked)} of the {len(samples)} instances of split {split!r}")
    for index, sample in enumerate(picked):
        _check_views(task, sample, index, fail)
    passed("views")
    passed("formats", f"{task.num_formats} prompt formats")
    if needs_evidence(task):
        _check_evidence(task, picked, fail)
        passed("evidence")
    for sample in picked:
        _check_scoring(task, sample, answer_text, fail)
    passed("extract", f"{len(JUNK_TEXTS)} junk texts")
    passed("score")

    def new_env(**extra: Any) -> ConversationEnv:
        return ConversationEnv(task, **{"split": split, "pm": pm, **dict(env_kwargs or {}), **extra})

    _check_episode_seed(new_env, task, seeds, fail)
    passed("episode_seed", f"seeds {list(seeds)}")
    _check_pettingzoo(new_env, api_cycles, fail, passed)
    return CheckReport(
        task_id=task.id,
        split=split,
        samples_checked=len(picked),
        formats_checked=task.num_formats,
        checks=tuple(checks),
    )


_Fail = Callable[[str, str], TaskContractError]


def _check_agents(task: Task, fail: _Fail) -> None:
    agents = task.agents
    if (
        not isinstance(agents, tuple)
        or not agents
        or not all(isinstance(a, str) and a for a in agents)
        or len(set(agents)) != len(agents)
    ):
        raise fail("agents", f"expected a non-empty tuple of distinct non-empty names, got {agents!r}")
    if not isinstance(task.num_formats, int) or task.num_formats < 0:
        raise fail("agents", f"num_formats must be an int >= 0, got {task.num_formats!r}")


def _views(task: Task, sample: TaskSample, seed: int, format_index: int | None, fail: _Fail) -> dict:
    views = dict(task.views(sample, rng=random.Random(seed), format_index=format_index))
    where = f"sample {sample.id!r}, format_index={format_index}"
    if set(views) != set(task.agents):
        raise fail("views", f"{where}: views for {sorted(views)}, expected one per agent {list(task.agents)}")
    for agent, view in views.items():
        if not isinstance(view, AgentView) or view.agent != agent:
            raise fail(
                "views", f"{where}: views[{agent!r}] must be an AgentView for {agent!r}, got {view!r:.200}"
            )
        for name in ("system_prompt", "base_system_prompt"):
            text = getattr(view, name)
            if not isinstance(text, str) or not text.strip():
                raise fail("views", f"{where}: {agent}'s {name} is empty or not a str: {text!r:.80}")
    return views


def _check_views(task: Task, sample: TaskSample, index: int, fail: _Fail) -> None:
    base_views = _views(task, sample, index, None, fail)
    if base_views != _views(task, sample, index, None, fail):
        raise fail("views", f"sample {sample.id!r}: the same rng seed gave different views")
    for agent, view in base_views.items():
        if view.system_prompt != view.base_system_prompt:
            raise fail(
                "formats", f"without a format, {agent}'s system_prompt must equal its base_system_prompt"
            )
    for k in range(task.num_formats):
        views = _views(task, sample, index, k, fail)
        for agent, view in views.items():
            if view.base_system_prompt != base_views[agent].system_prompt:
                raise fail(
                    "formats",
                    f"format {k}: {agent}'s base_system_prompt must be exactly the prompt without a "
                    "format (what format_index=None gives for the same rng seed)",
                )
        if all(v.system_prompt == v.base_system_prompt for v in views.values()):
            raise fail("formats", f"format {k} changed no agent's system_prompt")


def _check_evidence(task: Task, picked: Sequence[TaskSample], fail: _Fail) -> None:
    try:
        require_evidence(task, picked)
    except TaskContractError as exc:
        raise fail("evidence", str(exc)) from exc
    for index, sample in enumerate(picked):
        for agent, view in _views(task, sample, index, None, fail).items():
            hidden = [u for u in view.private if u not in view.base_system_prompt]
            if hidden:
                raise fail(
                    "evidence",
                    f"sample {sample.id!r}: {agent}'s private unit {hidden[0]!r:.80} is not in its "
                    "prompt; AgentView.private must list the evidence the prompt shows, verbatim",
                )


def _score(task: Task, answer: str | None, sample: TaskSample, fail: _Fail) -> float:
    try:
        value = task.score(answer, sample)
    except Exception as exc:
        raise fail("score", f"score({answer!r:.60}) raised {type(exc).__name__}: {exc}") from exc
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise fail("score", f"score({answer!r:.60}) = {value!r}; expected a number in [0, 1]")
    if math.isnan(value):
        raise fail("score", f"score({answer!r:.60}) is NaN")
    return float(value)


def _check_scoring(
    task: Task, sample: TaskSample, answer_text: Callable[[TaskSample], str] | None, fail: _Fail
) -> None:
    _score(task, None, sample, fail)
    for text in (*JUNK_TEXTS, *(f"{a}: {j}" for a in task.agents[:1] for j in JUNK_TEXTS[:8])):
        try:
            answer = task.extract_answer(text)
        except Exception as exc:
            raise fail("extract", f"extract_answer({text!r:.60}) raised {type(exc).__name__}: {exc}") from exc
        if answer is not None and not isinstance(answer, str):
            raise fail(
                "extract", f"extract_answer({text!r:.60}) returned {type(answer).__name__}, not str/None"
            )
        _score(task, answer, sample, fail)
        _score(task, text, sample, fail)
    if _score(task, sample.answers[0], sample, fail) != 1.0:
        raise fail("score", f"the gold answer {sample.answers[0]!r:.80} of {sample.id!r} does not score 1")
    if answer_text is not None:
        text = answer_text(sample)
        answer = task.extract_answer(text)
        if _score(task, answer, sample, fail) != 1.0:
            raise fail("score", f"the turn {text!r:.80} extracts to {answer!r:.80}, which does not score 1")


def _scripted_reply(request: GenerationRequest) -> str:
    turn = sum(1 for m in request.messages if m.get("role") != "system")
    return _SCRIPT[turn % len(_SCRIPT)]


def _check_episode_seed(
    new_env: Callable[..., ConversationEnv], task: Task, seeds: Sequence[int], fail: _Fail
) -> None:
    settings = [{}] + ([{"diverse_formats": True}] if task.num_formats else [])
    for extra in settings:
        for seed in seeds:
            first, second = (
                run_episode(new_env(**extra), ScriptedPolicy(_scripted_reply), seed=seed) for _ in range(2)
            )
            if first != second:
                raise fail(
                    "episode_seed", f"seed {seed} ({extra or 'base prompts'}) gave two different episodes"
                )
            if Episode.from_dict(json.loads(json.dumps(first.to_dict()))) != first:
                raise fail("episode_seed", f"the episode of seed {seed} does not round-trip through JSON")


def _check_pettingzoo(
    new_env: Callable[..., ConversationEnv], cycles: int, fail: _Fail, passed: Callable[[str, str], None]
) -> None:
    from pettingzoo.test import api_test, parallel_api_test, seed_test
    from pettingzoo.utils.conversions import aec_to_parallel

    quiet = _Quiet()
    for name, run in (
        ("api_test", lambda: api_test(new_env(), num_cycles=cycles)),
        ("seed_test", lambda: seed_test(new_env, num_cycles=cycles)),
        (
            "parallel_api_test",
            lambda: parallel_api_test(aec_to_parallel(new_env(cycle_aligned=True)), num_cycles=cycles),
        ),
    ):
        try:
            with quiet:
                run()
        except AssertionError as exc:
            raise fail("api_test", f"PettingZoo {name} failed: {exc or type(exc).__name__}") from exc
        passed("api_test", f"PettingZoo {name}, {cycles} cycles")


class _Quiet:
    """Silences PettingZoo's tests while they pass: their progress prints, their generic warnings
    (space types, agent names) and the env's notice about the test's made-up reset options, none
    of which is about the task. A failing test still raises its AssertionError."""

    def __enter__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        self._stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore", UserWarning)
        env_logger = logging.getLogger("optima_env.conversation_env")
        level = env_logger.level
        env_logger.setLevel(logging.ERROR)
        self._stack.callback(env_logger.setLevel, level)

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
