"""The run folder: configuration, per-stage files, state, metrics, and an exclusive lock.

Layout (``runs/<task>__<trainer>__<seed>__<time>/`` by default)::

    config.json            the resolved TrainConfig (written once, checked on --resume)
    state.json             where the run stands (rewritten atomically after every phase)
    metrics.jsonl          one line per finished stage (mean reward, task score, tokens, counts,
                           training loss, wall time per phase)
    iter_00/               one folder per stage (isft-dpo: iter_00_sft/, iter_00_dpo/, ...)
        episodes.jsonl     rollouts, appended as each ends (resumed, never regenerated)
        scored.jsonl       the same episodes with readability and rewards (atomic)
        selected.jsonl     iSFT training trajectories (atomic)
        normalizer.jsonl   DPO stages: the token-normalizer rollouts (appended, resumed)
        trees.jsonl        DPO stages: per tree, its pairs (appended as it ends, resumed by tree)
        pairs.jsonl        DPO stages: the kept preference pairs (atomic)
        *.rank1of2.jsonl   under several processes: each rank's shard of episodes.jsonl,
                           normalizer.jsonl, trees.jsonl (and a .done marker), appended and
                           resumed, gathered into the files above by the main process and removed
                           (optima_trainers.generation.shards)
        checkpoint/        the trained model (temp folder + COMPLETE manifest + rename)
        result.json        the stage's outcome: next model and metrics (atomic; marks it done)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optima_env.configtree import ConfigError
from optima_env.errors import DataError, TaskContractError
from optima_env.io import append_jsonl, read_json_object, read_jsonl, read_text, write_json_atomic
from optima_env.paths import folder_lock
from optima_trainers.config.train import TrainConfig
from optima_trainers.run.run_format import old_format_error

__all__ = [
    "RunDir",
    "default_run_name",
    "read_instances",
    "read_json",
    "read_stage_result",
    "wait_for",
]

_RESULT_FIELDS = {"model": str, "cursor_end": int, "metrics": dict}


def default_run_name(config: TrainConfig) -> str:
    """``<task>__<trainer>__<seed>__<YYYYmmdd-HHMMSS>`` (``/`` in the task id becomes ``_``)."""
    return (
        f"{config.task.replace('/', '_')}__{config.trainer}__{config.seed}__{time.strftime('%Y%m%d-%H%M%S')}"
    )


def _format_1_mark(config: Mapping[str, Any]) -> str | None:
    """What marks a stored ``config.json`` as run folder format 1, or ``None``."""
    for section, name in (("tree", "reward"), ("generation", "compute_type")):
        if isinstance(config.get(section), Mapping) and name in config[section]:
            return f"field '{section}.{name}'"
    return None


def read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A JSON object written atomically by the run (``result.json``, ...); :class:`DataError`
    (naming the file, and the line when the JSON is broken) if it is corrupt."""
    return read_json_object(path, fix="delete it to rerun that stage's last phase")


def read_stage_result(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A stage's ``result.json``, checked to hold ``model`` (str), ``cursor_end`` (int) and
    ``metrics`` (object); :class:`DataError` names the file and the bad field."""
    record = read_json(path)
    for name, type_ in _RESULT_FIELDS.items():
        value = record.get(name)
        if not isinstance(value, type_) or isinstance(value, bool):
            got = f"expected {type_.__name__}, got {type(value).__name__}" if name in record else "missing"
            raise DataError(f"{path}: field '{name}': {got}; delete it to rerun that stage's last phase")
    return record


def read_instances(path: str | os.PathLike[str]) -> list[int]:
    """A stage's ``instances.json`` (a JSON list of split positions); :class:`DataError` names the file."""
    text = read_text(path)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON ({exc}); delete it to redo the stage") from exc
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise DataError(
            f"{path}: expected a JSON list of ints, got {text[:60]!r}; delete it to redo the stage"
        )
    return value


class RunDir:
    """One run's folder (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()

    def portable(self, model: str) -> str:
        """A model path as stored in ``result.json``: relative when it lies inside the run folder."""
        path = Path(model)
        if path.is_absolute() and path.is_relative_to(self.root):
            return path.relative_to(self.root).as_posix()
        return model

    def model_path(self, stored: str) -> str:
        """The inverse of :meth:`portable`: a stored model path made usable from any directory."""
        candidate = self.root / stored
        return str(candidate) if not Path(stored).is_absolute() and candidate.exists() else stored

    # -- creation and resumption ------------------------------------------------------------------
    @classmethod
    def create(
        cls, config: TrainConfig, *, run_dir: str | os.PathLike[str] | None = None, base: str = "runs"
    ) -> RunDir:
        """A new run folder holding ``config.json``; refuses a folder that already holds a run."""
        if run_dir is None:
            root = _new_folder(Path(base), default_run_name(config))
        else:
            root = Path(run_dir)
            if (root / "config.json").exists():
                raise TaskContractError(
                    f"{root} already holds a run; pass --resume to continue it, or choose another --run-dir"
                )
            root.mkdir(parents=True, exist_ok=True)
        run = cls(root)
        write_json_atomic(root / "config.json", config.to_dict())
        run.save_state(status="created")
        return run

    @classmethod
    def open(cls, run_dir: str | os.PathLike[str]) -> tuple[RunDir, TrainConfig]:
        """An existing run folder and its stored configuration."""
        root = Path(run_dir)
        path = root / "config.json"
        if not path.is_file():
            raise DataError(f"{root} is not a run folder (no config.json); check --run-dir")
        fix = "the run cannot be resumed: repair the file, or start a new run"
        data = read_json_object(path, fix=fix)
        older = _format_1_mark(data)
        if older:
            raise old_format_error(path, older)
        try:
            config = TrainConfig.from_dict(data)
        except (DataError, TaskContractError) as exc:
            raise DataError(f"{path}: {exc}; {fix}") from exc
        return cls(root), config

    @classmethod
    def open_or_create(cls, config: TrainConfig, run_dir: str | os.PathLike[str]) -> RunDir:
        """The run in ``run_dir``: created with ``config`` when the folder holds none, else
        reopened when its stored settings are ``config``'s (only ``iterations`` may differ).

        Raises:
            ConfigError: the folder holds a run with other settings (each listed as
                ``(stored, given)``).
        """
        root = Path(run_dir)
        if not (root / "config.json").is_file():
            return cls.create(config, run_dir=root)
        run, stored = cls.open(root)
        conflicts = stored.resume_conflicts(config)
        if conflicts:
            raise ConfigError(
                f"{root} holds a run with other settings (stored, given): {conflicts}; only the number "
                "of iterations may change on resume: use another run folder or delete this one"
            )
        return run

    def adopt_stage(self, stage: str, source: RunDir, source_stage: str) -> None:
        """Take the finished stage ``source_stage`` of another run as this run's ``stage`` (e.g.
        an iSFT-DPO run's initialization from an iSFT run with the same settings, spec §4).

        The files are hard links, assembled under a temporary name and renamed, so a crash leaves
        either no stage (it is adopted again) or the whole one; the stage's ``adopted.json``
        names its source (:meth:`adopted_from`). An unfinished stage of this run's own is replaced;
        a finished one is never touched.

        Raises:
            TaskContractError: ``source_stage`` has not finished, or ``stage`` has.
        """
        origin = source.root / source_stage
        if not (origin / "result.json").is_file():
            raise TaskContractError(
                f"{origin} is not a finished stage (no result.json); finish that run first"
            )
        target = self.stage(stage)
        if (target / "result.json").is_file():
            raise TaskContractError(f"{target} has finished already; it cannot adopt {origin}")
        tmp = self.root / f".{stage}.adopting"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(origin, tmp, copy_function=os.link)
        (tmp / "result.json").unlink()  # a link to the source's file: rewritten, not edited in place
        record = read_stage_result(origin / "result.json")
        if record["model"].startswith(f"{source_stage}/"):
            record["model"] = stage + record["model"][len(source_stage) :]
        write_json_atomic(tmp / "adopted.json", {"from": str(origin)})
        write_json_atomic(tmp / "result.json", record)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)

    def adopted_from(self, stage: str) -> str | None:
        """The folder stage ``stage`` was adopted from (:meth:`adopt_stage`), or None."""
        path = self.root / stage / "adopted.json"
        return str(read_json_object(path)["from"]) if path.is_file() else None

    @staticmethod
    def latest(base: str | os.PathLike[str], prefix: str) -> Path | None:
        """The newest run folder under ``base`` whose name starts with ``prefix``."""
        base = Path(base)
        if not base.is_dir():
            return None
        found = sorted(
            p for p in base.iterdir() if p.name.startswith(prefix) and (p / "config.json").is_file()
        )
        return found[-1] if found else None

    # -- files ------------------------------------------------------------------------------------
    def stage(self, name: str) -> Path:
        """The folder of one stage (created on demand)."""
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def state(self) -> dict[str, Any]:
        """The last saved state (empty before the first phase)."""
        path = self.root / "state.json"
        if not path.is_file():
            return {}
        # written atomically: only a foreign edit gets a bad file here
        fix = "delete it, the run's files carry the truth"
        state = read_json_object(path, fix=fix)
        if not isinstance(state.get("timings", {}), dict):
            got = type(state["timings"]).__name__
            raise DataError(f"{path}: field 'timings': expected object, got {got}; {fix}")
        return state

    def save_state(self, **updates: Any) -> dict[str, Any]:
        """Merge ``updates`` into the state and write it atomically."""
        state = {**self.state(), **updates, "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
        write_json_atomic(self.root / "state.json", state)
        return state

    def record_phase(self, stage: str, phase: str, seconds: float, **extra: Any) -> None:
        """Note that ``phase`` of ``stage`` finished (and how long it took) in the state."""
        self.save_state(stage=stage, phase=phase, timings=self._timings_plus(stage, phase, seconds), **extra)

    def record_time(self, stage: str, phase: str, seconds: float) -> None:
        """Add ``seconds`` to ``phase`` of ``stage`` in the state without marking it finished (the
        saved part of a phase still running, :class:`~optima_trainers.generation.rollouts.PhaseClock`)."""
        self.save_state(timings=self._timings_plus(stage, phase, seconds))

    def _timings_plus(self, stage: str, phase: str, seconds: float) -> dict[str, Any]:
        timings = self.state().get("timings", {})
        timings.setdefault(stage, {})[phase] = timings.get(stage, {}).get(phase, 0.0) + seconds
        return timings

    def timings(self, stage: str) -> dict[str, float]:
        """Seconds spent per phase of ``stage`` (summed over resumptions)."""
        return dict(self.state().get("timings", {}).get(stage, {}))

    def metrics(self) -> list[dict[str, Any]]:
        """The records of ``metrics.jsonl`` (one per finished stage)."""
        path = self.root / "metrics.jsonl"
        if not path.is_file():
            return []

        def parse(record: Any) -> dict[str, Any]:
            if not isinstance(record, dict) or not isinstance(record.get("stage"), str):
                raise DataError(
                    f"field 'stage': expected a JSON object with a str 'stage', got {record!r:.60}"
                )
            return record

        return read_jsonl(path, parse, fix="delete that line (the stage re-appends it)")

    def append_metrics(self, record: Mapping[str, Any]) -> None:
        """Append one stage's record unless that stage is already recorded."""
        if any(r.get("stage") == record.get("stage") for r in self.metrics()):
            return
        path = self.root / "metrics.jsonl"
        if path.is_file():
            text = read_text(path)
            if text and not text.endswith("\n"):  # drop a torn line before appending
                path.write_text(text[: text.rfind("\n") + 1], encoding="utf-8")
        append_jsonl(path, [dict(record)])

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """Hold the run's one-writer lock (:func:`optima_env.paths.folder_lock`: a second process
        on the same run fails at once, naming the holder's pid; a dead holder's lock is free)."""
        return folder_lock(self.root, what="the run folder")

    def started(self) -> bool:
        """Whether the run holds work: a phase finished (the state names a stage), or a stage
        folder holds a non-empty record file or a checkpoint. A stage folder holding only its
        instance list (made before its model failed to load) is not work."""
        if "stage" in self.state():
            return True
        for folder in (p for p in self.root.iterdir() if p.is_dir()):
            for path in folder.iterdir():
                if path.is_dir() or (path.suffix in (".jsonl", ".json") and path.name != "instances.json"
                                     and path.stat().st_size > 0):  # fmt: skip
                    return True
        return False

    def discard_unstarted(self) -> bool:
        """Remove this run's own files when no stage has begun (a run that failed at start-up),
        so the corrected command, or the same ``--run-dir``, starts afresh; the folder goes too
        when nothing else is in it. Returns whether the run was discarded (a run some process
        holds, or one that started, is kept)."""
        try:
            with self.lock():
                if self.started():
                    return False
                for folder in (p for p in self.root.iterdir() if p.is_dir()):
                    shutil.rmtree(folder)  # stage folders without work (see started)
                for name in ("config.json", "state.json", "metrics.jsonl"):
                    (self.root / name).unlink(missing_ok=True)
        except TaskContractError:  # held by another process: not ours to remove
            return False
        with contextlib.suppress(OSError):
            self.root.rmdir()  # only when empty: a user's own files stay
        return True


def _new_folder(base: Path, name: str) -> Path:
    """``base/name``, created here and now; when another run took that name in the same second,
    ``name-2``, ``name-3``, ... (``mkdir`` is atomic, so two runs never share a folder)."""
    base.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        root = base / (name if n == 1 else f"{name}-{n}")
        try:
            root.mkdir()
        except FileExistsError:
            continue
        return root
    raise TaskContractError(f"{base}: 999 run folders named {name}*; pass --run-dir")


def wait_for(path: Path, *alternatives: Path, poll_s: float = 1.0) -> Path:
    """Block until ``path`` (or one of ``alternatives``) exists; returns ``path``."""
    while not path.exists() and not any(a.exists() for a in alternatives):
        time.sleep(poll_s)
    return path
