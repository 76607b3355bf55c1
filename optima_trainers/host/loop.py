"""The host loop: generate → score → select → deliver to the backend → train → next model.

:class:`IterativeTrainer` runs any registered trainer backend (:mod:`optima_trainers.backends.contract`)
the same way: it holds the backend and calls it (the contract: :class:`~optima_trainers.backends.contract.
TrainerBackend`), asks it for the stages (``backend.stages``), and for each stage not finished yet:

* generates with the current model: ``samples`` stages play N conversations on each of the next
  ``generation.instances`` training instances (the cursor continues across stages and wraps; the
  initialization uses the format-diverse pool at ``generation.init_temperature``); ``tree``
  stages set the token normalizer and grow the MCTS trees (:mod:`optima_trainers.generation.tree_stage`);
* scores in one place with the run's rewards: ``config.reward`` per instance group (per-instance
  max normalizer, spec §3) with the frozen base model's readability, or ``config.tree_reward``
  (derived from ``config.reward``) with the tree normalizer; fires ``optima_episode_scored`` for
  every scored episode;
* selects (samples stages) through ``optima_select_training_data`` (built in:
  :func:`optima_trainers.sft.selection.select_isft`);
* reads the stage's data back from the stage folder, fires ``optima_generation_end`` with it,
  and calls ``backend.train(data, context)`` (a :class:`~optima_trainers.backends.contract.StageContext`),
  from the base model or the previous one as the stage says.

The training events are typed hookspecs of :mod:`optima_trainers.hookspecs`, added to the run's
plugin manager here; the backend is registered on it for the run, so it may observe them too.

Every phase's output is on disk before the next starts (:mod:`optima_trainers.run.folder`), so a killed
run resumes where it stopped with the same data as an uninterrupted one. Under ``accelerate
launch`` with several processes, every process generates its shard of each stage's jobs with its
own engine and scores that shard with its own scorer (:mod:`optima_trainers.generation.shards`,
:mod:`optima_trainers.generation.stage`); the main process gathers the scored shards and selects;
the others wait for the stage's data on disk, then every process receives it through the same hook
and trains.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pluggy

from optima_env.configtree import ConfigError
from optima_env.errors import PluginError
from optima_env.io import write_json_atomic
from optima_env.models import resolve_model_path
from optima_env.registry import get_plugin_manager, make_task, trainer_specs
from optima_trainers.backends.contract import StageContext, TrainerBackend
from optima_trainers.config.train import TrainConfig, check_options
from optima_trainers.generation.rollouts import check_readability_scorer
from optima_trainers.generation.samples import read_sample_stage
from optima_trainers.generation.shards import Shard
from optima_trainers.generation.stage import StageGeneration
from optima_trainers.generation.tree_stage import read_tree_stage
from optima_trainers.hookspecs import add_trainer_hookspecs
from optima_trainers.run.adapters import missing_files, restore_weights
from optima_trainers.run.checkpoint import discard_partial, is_complete, require_complete, train_metrics
from optima_trainers.run.folder import RunDir, read_instances, read_stage_result, wait_for
from optima_trainers.run.stages import Stage, StageData, StageOutcome

__all__ = ["IterativeTrainer", "describe_plan", "plan_stages"]

logger = logging.getLogger(__name__)


def _builtin_plugin(pm: pluggy.PluginManager) -> None:
    from optima_trainers.backends import builtin as plugin

    add_trainer_hookspecs(pm)
    if not pm.is_registered(plugin) and pm.get_plugin("optima_trainers") is None:
        pm.register(plugin, name="optima_trainers")


def _backend(config: TrainConfig, pm: pluggy.PluginManager) -> tuple[Any, Any]:
    specs = trainer_specs(pm)
    if config.trainer not in specs:
        raise ConfigError(
            f"no trainer {config.trainer!r}; registered: {', '.join(specs)} (a third-party trainer is "
            "found through the 'optima' entry points: is its package installed?)"
        )
    spec = specs[config.trainer]
    check_options(config, spec)
    backend = spec.factory(config)
    if not isinstance(backend, TrainerBackend):
        raise PluginError(
            f"trainer {config.trainer!r}: its factory returned {type(backend).__name__}, expected an "
            "optima_trainers.backends.contract.TrainerBackend "
            "(subclass it and implement stages() and train())"
        )
    return spec, backend


def plan_stages(config: TrainConfig, pm: pluggy.PluginManager | None = None) -> list[Stage]:
    """The stages the run's backend declares for ``config``."""
    pm = pm or get_plugin_manager()
    _builtin_plugin(pm)
    _, backend = _backend(config, pm)
    return backend.stages(config)


def describe_plan(config: TrainConfig, stages: list[Stage]) -> str:
    """The run's stages in one line, so ``--iterations`` is never guessed at: ``isft --iterations 3:
    3 stages: iter_00 (init), iter_01 (sft), iter_02 (sft)``."""
    labels = ", ".join(f"{s.name} ({'init' if s.init else s.kind})" for s in stages)
    return f"{config.trainer} --iterations {config.iterations}: {len(stages)} stages: {labels}"


class IterativeTrainer:
    """Runs (or resumes) the stages of one training run with its trainer backend.

    Args:
        config: the run configuration (:func:`optima_trainers.config.train.resolve_config`).
        run_dir: the run folder (:meth:`RunDir.create` or :meth:`RunDir.open`).
        pm: plugin manager whose hooks are fired (default: a fresh one with entry points); the
            built-in plugin (trainers, selection) is registered on it if missing.
        progress: show tqdm progress bars.
    """

    config: TrainConfig
    """The run configuration."""
    run_dir: RunDir
    """The run folder."""
    pm: pluggy.PluginManager
    """The plugin manager the hooks are fired on (the backend is registered on it for the run)."""
    backend: Any
    """The trainer backend (a plugin object built by its ``TrainerSpec.factory``)."""
    generation: StageGeneration
    """The run's generation: its policies, env settings, readability scorer and stage data."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        run_dir: RunDir,
        pm: pluggy.PluginManager | None = None,
        progress: bool = True,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.pm = pm or get_plugin_manager()
        _builtin_plugin(self.pm)
        self.spec, self.backend = _backend(config, self.pm)
        check_readability_scorer(config, self.pm)
        self.progress = progress
        self.task = make_task(config.task, pm=self.pm, **dict(config.task_kwargs))
        unknown = set(config.generation.agent_models) - set(self.task.agents)
        if unknown or set(config.generation.agent_models) >= set(self.task.agents):
            raise ConfigError(
                f"generation.agent_models must name some (not all) of {list(self.task.agents)}, got "
                f"{sorted(config.generation.agent_models)}: the others are the roles that train"
            )
        self.base_model = resolve_model_path(config.model)
        self._verified: set[str] = set()
        self.generation = StageGeneration(
            config=config, run_dir=run_dir, pm=self.pm, task=self.task, base_model=self.base_model,
            progress=progress,
        )  # fmt: skip

    # -- driver ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _registered(self) -> Iterator[None]:
        name = f"optima-trainer-backend:{self.config.trainer}"
        self.pm.register(self.backend, name=name)
        tracker = None
        if self.config.report_to != "none" and _rank() == 0:
            from optima_trainers.run.tracking import StageTracker

            tracker = StageTracker(self.config.report_to, self.run_dir.root)
            self.pm.register(tracker, name="optima-stage-tracker")
        try:
            yield
        finally:
            self.generation.loader.close()  # the engine kept for the run (vLLM), if any
            self.pm.unregister(self.backend)
            if tracker is not None:
                self.pm.unregister(tracker)
                tracker.close()

    def stages(self) -> list[Stage]:
        """The run's stages, as the backend declares them (``backend.stages``)."""
        with self._registered():
            return self._stages()

    def _stages(self) -> list[Stage]:
        stages = self.backend.stages(self.config)
        if not stages or not all(isinstance(s, Stage) for s in stages):
            raise PluginError(
                f"trainer {self.config.trainer!r}: stages() must return a non-empty list of "
                f"optima_trainers.run.stages.Stage, got {stages!r}"
            )
        if len({s.name for s in stages}) != len(stages):
            raise PluginError(f"trainer {self.config.trainer!r}: stage names must be unique")
        return list(stages)

    def run(self) -> list[dict[str, Any]]:
        """Run every stage not finished yet; returns the metrics of every stage."""
        with self._registered():
            if _rank() != 0:
                return self._follow()
            with self.run_dir.lock():
                self.pm.hook.optima_configure.call_historic(kwargs={"config": self.config.to_dict()})
                model, cursor = self.base_model, 0
                stages = self._stages()
                for number, stage in enumerate(stages, start=1):
                    done = self.run_dir.root / stage.name / "result.json"
                    if done.is_file():
                        record = read_stage_result(done)
                        self._restore(stage, model, record)
                    else:
                        logger.info("stage %d/%d: %s (%s)", number, len(stages), stage.name, stage.kind)
                        self.pm.hook.optima_iteration_start(
                            iteration=stage.number, config=self.config.to_dict()
                        )
                        record = self._stage(stage, model, cursor)
                        write_json_atomic(done, record)
                        self.run_dir.save_state(stage=stage.name, phase="done", model=record["model"])
                        self.pm.hook.optima_iteration_end(iteration=stage.number, metrics=record["metrics"])
                    self.run_dir.append_metrics(
                        {"stage": stage.name, "kind": stage.kind, **record["metrics"]}
                    )
                    model, cursor = self._next(stage, model, record)
                self.run_dir.save_state(status="finished", model=model)
        return self.run_dir.metrics()

    def _stage(self, stage: Stage, model: str, cursor: int) -> dict[str, Any]:
        self._verify_model(model)
        folder = self.run_dir.stage(stage.name)
        cursor_end = self.generation.generate(stage, model, cursor, folder, Shard.current())
        data = self._deliver(stage, folder)
        start = self.base_model if stage.start == "base" else model
        started = time.perf_counter()
        outcome = self._train(stage, start, folder, data)
        self.generation.record_phase(stage, "train", started)
        metrics = {
            "iteration": float(stage.number),
            **data.metrics,
            **outcome.metrics,
            **train_metrics(outcome.result),
            **{f"time/{k}_s": v for k, v in self.run_dir.timings(stage.name).items()},
        }
        checkpoint = outcome.result.checkpoint if outcome.result else model
        history = [dict(h) for h in outcome.result.history] if outcome.result else []  # the trainer's log
        return {"model": self.run_dir.portable(checkpoint), "cursor_end": cursor_end, "metrics": metrics,
                "history": history}  # fmt: skip

    def _follow(self) -> list[dict[str, Any]]:
        """A non-main process: generate and score its shard of each stage's jobs, receive the stage's data
        from disk once the main process gathered it, and train with the others."""
        model, cursor, shard = self.base_model, 0, Shard.current()
        for stage in self._stages():
            folder = self.run_dir.root / stage.name
            done = folder / "result.json"
            if not done.is_file():
                self._verify_model(model)
                wanted = folder / {"samples": "selected.jsonl", "tree": "pairs.jsonl"}.get(
                    stage.generate, "instances.json"
                )
                if not wanted.is_file():
                    self.generation.generate(stage, model, cursor, self.run_dir.stage(stage.name), shard)
                wait_for(wanted, done)
                if not done.is_file():
                    data = self._deliver(stage, folder)
                    self._train(stage, self.base_model if stage.start == "base" else model, folder, data)
                wait_for(done)
            record = read_stage_result(done)
            self._restore(stage, model, record)
            model, cursor = self._next(stage, model, record)
        return self.run_dir.metrics()

    def _next(self, stage: Stage, previous: str, record: dict[str, Any]) -> tuple[str, int]:
        """The model and cursor after a finished stage; the loader learns which model the stage
        trained from (:meth:`~optima_trainers.generation.engines.PolicyLoader.record_stage`)."""
        model = self.run_dir.model_path(record["model"])
        self.generation.loader.record_stage(model, self.base_model if stage.start == "base" else previous)
        return model, record["cursor_end"]

    def _restore(self, stage: Stage, previous: str, record: dict[str, Any]) -> None:
        """Rebuild a finished stage's merged weights from its adapter when they are missing (a run
        folder that travelled without them: :mod:`optima_trainers.run.adapters`)."""
        checkpoint = Path(self.run_dir.model_path(record["model"]))
        if checkpoint.is_absolute() and is_complete(checkpoint) and missing_files(checkpoint):
            start = self.base_model if stage.start == "base" else previous
            restore_weights(checkpoint, start, dtype=self.config.dtype)
            self._verified.discard(str(checkpoint))

    def _train(self, stage: Stage, start_model: str, folder: Path, data: StageData) -> StageOutcome:
        checkpoint = folder / "checkpoint"
        if is_complete(checkpoint):
            return StageOutcome(result=require_complete(checkpoint))
        self.generation.drop_scorer()  # the frozen readability model is not resident while a stage trains
        if _rank() == 0:  # only the main process writes (and cleans) the run folder
            discard_partial(checkpoint)
        context = StageContext(
            config=self.config,
            task=self.task,
            stage=stage,
            start_model=start_model,
            base_model=self.base_model,
            output_dir=checkpoint,
            events=self.pm.hook,
            load_policy=self.generation.load,
            readability=lambda: self.generation.scorer,
        )
        outcome = self.backend.train(data, context)
        if not isinstance(outcome, StageOutcome):
            raise PluginError(
                f"trainer {self.config.trainer!r}: train() must return an "
                f"optima_trainers.run.stages.StageOutcome, got {outcome!r}"
            )
        if outcome.result is not None:  # written (and hashed) here: not verified again before loading
            self._verified.add(str(outcome.result.checkpoint))
        return outcome

    def _verify_model(self, model: str) -> None:
        """Verify a checkpoint before a stage loads it: one of this run's (it must be complete),
        or any folder with a ``COMPLETE`` marker. A corrupt one raises
        :class:`~optima_trainers.run.checkpoint.CorruptCheckpointError`: the run stops, nothing is deleted.

        Each checkpoint is hashed once: by its writer as it is written, and by the main process
        when this process did not write it (a resumed run, another run's model); the other
        processes see the same files on the shared folder and do not hash them again."""
        path = Path(model)
        if str(path) in self._verified or _rank() != 0:
            return
        if is_complete(path) or (path.is_absolute() and path.is_relative_to(self.run_dir.root)):
            require_complete(path)
        self._verified.add(str(path))

    # -- delivery -------------------------------------------------------------------------------
    def _deliver(self, stage: Stage, folder: Path) -> StageData:
        """Read the stage's data back from disk and fire ``optima_generation_end`` with it."""
        if stage.generate == "none":
            indices = read_instances(folder / "instances.json")
            data = StageData(stage=stage, folder=folder, instances=tuple(indices))
        elif stage.generate == "tree":
            episodes, pairs, metrics = read_tree_stage(folder, self.config)
            data = StageData(
                stage=stage, folder=folder, episodes=tuple(episodes), pairs=tuple(pairs), metrics=metrics
            )
        else:
            scored, selected, metrics = read_sample_stage(folder)
            data = StageData(
                stage=stage, folder=folder, episodes=tuple(scored), selected=tuple(selected), metrics=metrics
            )
        self.pm.hook.optima_generation_end(stage=stage, data=data)
        return data


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))
