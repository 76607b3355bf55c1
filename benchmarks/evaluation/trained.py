"""Evaluate as trained: the rules a checkpoint's training run played by.

A ``--checkpoint NAME=PATH`` inside a training run folder (``runs/<run>/<stage>/checkpoint``)
was trained on conversations of that run's task, built with its task arguments and played under
its caps (turns, tokens per turn, turns cut at speaker tags). :func:`trained_rules` reads them
from the run's ``config.json``, so the benchmark plays the checkpoint the way it learned, unless
``--max-turns``, ``--max-new-tokens`` or ``--task-arg`` say otherwise. Every system of the run
gets the same caps (the table compares like with like), and the report says where they came from.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optima_env.errors import RunConfigError

__all__ = ["TrainedRules", "trained_rules", "trained_task_kwargs"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainedRules:
    """The task arguments and caps of the training run the checkpoints come from."""

    runs: tuple[str, ...]
    """The run folders they were read from."""
    task: str
    """The task the run trained on (its task arguments apply to that task only)."""
    task_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int
    max_new_tokens: int
    stop_at_speaker_tags: bool


def _run_folder(checkpoint: str) -> Path | None:
    """The training run folder holding ``checkpoint`` (its stage's folder's parent), or None."""
    path = Path(checkpoint)
    for folder in (path.parent, path.parent.parent):
        if (folder / "config.json").is_file() and (folder / "state.json").is_file():
            return folder
    return None


def trained_rules(checkpoints: Mapping[str, str]) -> TrainedRules | None:
    """The rules of the run folders ``checkpoints`` come from; None when none is in a run folder.

    Raises:
        RunConfigError: two runs trained under different rules (the caps must be chosen).
    """
    from optima_trainers.run.folder import RunDir

    found: dict[str, tuple[TrainedRules, list[str]]] = {}
    for name, path in checkpoints.items():
        folder = _run_folder(path)
        if folder is None:
            continue
        _, config = RunDir.open(folder)
        g = config.generation
        rules = TrainedRules(runs=(), task=config.task, task_kwargs=dict(config.task_kwargs),
                             max_turns=g.max_turns, max_new_tokens=g.max_new_tokens,
                             stop_at_speaker_tags=g.stop_at_speaker_tags)  # fmt: skip
        key = json.dumps(dataclasses.asdict(rules), sort_keys=True, default=str)
        found.setdefault(key, (rules, []))[1].append(f"{name}: {folder}")
    if not found:
        return None
    if len(found) > 1:
        listed = "; ".join(f"{', '.join(v)} ({_describe(r)})" for r, v in found.values())
        raise RunConfigError(
            f"expected checkpoints trained under one set of rules, got {listed}; evaluate them in "
            "separate runs"
        )
    ((rules, sources),) = found.values()
    return dataclasses.replace(rules, runs=tuple(sources))


def _describe(rules: TrainedRules) -> str:
    return (
        f"task {rules.task} {dict(rules.task_kwargs)}, {rules.max_turns} turns x {rules.max_new_tokens} "
        f"tokens{', cut at speaker tags' if rules.stop_at_speaker_tags else ''}"
    )


def trained_task_kwargs(rules: TrainedRules | None, names: tuple[str, ...], pm: Any) -> dict[str, Any]:
    """The run's task arguments for a task of the benchmark named ``names`` when it is the task the
    run trained on; none for any other task."""
    from optima_env.errors import OptimaError
    from optima_env.registry import resolve_task_id

    if rules is None:
        return {}
    for name in names:
        try:
            if resolve_task_id(name, pm) == rules.task:
                return dict(rules.task_kwargs)
        except OptimaError:  # not registered: open_task reports it
            continue
    return {}
