"""The trainer host's generation: the policies, env options and scorer of a run, and each stage's
generation (sampled stages, tree stages, an online backend's instance list) on every process.

:class:`StageGeneration` is the object :class:`~optima_trainers.host.loop.IterativeTrainer` holds
to generate; under ``accelerate launch`` with N processes every rank runs :meth:`generate` with its
own engine on its shard of the stage's jobs (:mod:`optima_trainers.generation.shards`) and scores that
shard with its own readability scorer (a sampled stage's episodes, a tree stage's trees); the main
process gathers the scored shards and selects (:mod:`~optima_trainers.generation.samples`,
:mod:`~optima_trainers.generation.tree_stage`).
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

import pluggy

from optima_env.io import write_json_atomic
from optima_env.models import context_length
from optima_env.policy import PerAgentPolicy
from optima_env.task import Task
from optima_trainers.config.env import EnvSettings
from optima_trainers.config.train import TrainConfig
from optima_trainers.generation.engines import PolicyLoader, check_stage_engine
from optima_trainers.generation.rollouts import GenerationContext, load_readability_scorer
from optima_trainers.generation.samples import generate_sample_stage
from optima_trainers.generation.shards import Shard
from optima_trainers.generation.tree_stage import generate_tree_stage
from optima_trainers.run.faults import fault_point
from optima_trainers.run.folder import RunDir
from optima_trainers.run.memory import release, track
from optima_trainers.run.stages import Stage, stage_seed

__all__ = ["StageGeneration"]


class StageGeneration:
    """A run's generation, held by the trainer host (:class:`~optima_trainers.host.loop.IterativeTrainer`):
    its policies (:attr:`loader`), env settings and readability scorer, and each stage's data.

    Args:
        config: the run configuration.
        run_dir: the run folder (phases are recorded in its state).
        pm: the plugin manager (hooks fired, scorers and engines looked up).
        task: the run's task.
        base_model: the starting model's path.
        progress: show progress bars.
    """

    def __init__(
        self,
        *,
        config: TrainConfig,
        run_dir: RunDir,
        pm: pluggy.PluginManager,
        task: Task,
        base_model: str,
        progress: bool,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.pm = pm
        self.task = task
        self.base_model = base_model
        self.progress = progress
        self.num_train = len(task.samples(config.split))
        """Rows of the training split (a cursor position ``p`` plays row ``p % num_train``)."""
        self._scorer: Any = None
        self.loader = PolicyLoader(config, free_for_engine=self.drop_scorer, pm=pm)
        """Loads the generation policies (with vLLM, one engine for the whole run)."""

    def _indices(self, start: int, count: int) -> list[int]:
        """Cursor positions ``start, ..., start + count - 1``: each its own draw (job key, sample id);
        the stages play row ``position % num_train`` (spec §5 item 2: the cursor wraps)."""
        return list(range(start, start + count))

    @functools.cached_property
    def max_model_len(self) -> int | None:
        """``generation.max_model_len``, else the context the starting model declares (a local
        folder or a hub id, :func:`optima_env.models.context_length`; ``None`` when neither says);
        read once per run."""
        if self.config.generation.max_model_len is not None:
            return self.config.generation.max_model_len
        return context_length(self.base_model)

    def _prompt_budget(self, policy: Any) -> int | None:
        """The longest prompt a turn may start from: the context less the turn cap. The context is
        the running engine's own (a vLLM engine's ``max_model_len``, which refuses longer prompts),
        else :attr:`max_model_len`. No budget without a chat tokenizer to count with, or without a
        known context length."""
        if not callable(getattr(getattr(policy, "tokenizer", None), "apply_chat_template", None)):
            return None
        context = getattr(policy, "max_model_len", None)
        if not isinstance(context, int) or isinstance(context, bool):
            context = self.max_model_len
        if context is None:
            return None
        return max(1, context - self.config.generation.max_new_tokens)

    def _env(self, policy: Any, *, diverse: bool = False) -> EnvSettings:
        """The run's env settings for ``policy`` (with ``diverse``: the format-diverse pool)."""
        return EnvSettings(
            max_prompt_tokens=self._prompt_budget(policy),
            tokenizer=getattr(policy, "tokenizer", None),
            diverse_formats=diverse,
            scoring=False,  # the run scores with its own reward (groups, readability)
            pm=self.pm,
        )

    def _policy(self, model: str) -> Any:
        gen = self.config.generation
        if gen.agent_models:  # fixed roles speak with their own model; the rest with the current one
            fixed = {a: self.load(m) for a, m in gen.agent_models.items()}
            return PerAgentPolicy(fixed, default=self.load(model))
        return self.load(model)

    def load(self, model: str) -> Any:
        """A policy speaking with ``model`` (:meth:`PolicyLoader.load`)."""
        return self.loader.load(model)

    def _release(self, policy: Any) -> None:
        self.loader.release(policy)

    def drop_scorer(self) -> None:
        """Before a stage trains, before a vLLM engine starts (it sizes itself from the memory free
        then, and refuses to start below gpu_memory_utilization) and before the kept engine wakes
        (it reallocates its weights and KV cache): the frozen readability model leaves, loaded
        again when a stage scores (:mod:`optima_trainers.run.memory_plan` plans it resident only
        while a stage scores, and beside the engine in tree stages)."""
        self._scorer = None
        release()

    @property
    def scorer(self) -> Any:
        """The frozen base model's per-turn LM loss, on every process (each scores its own shard):
        with ``generation.vllm_weights`` resolved to ``adapters``, the kept engine's own
        (:meth:`~optima_trainers.generation.engines.PolicyLoader.engine_scorer`: no model loaded);
        else the registered ``readability_scorer``, loaded when a stage scores and dropped before
        it trains and before a vLLM engine starts or wakes."""
        if self._scorer is None:
            engine_scorer = self.loader.engine_scorer()
            if engine_scorer is not None:  # the engine's base scores: nothing resident to drop
                self._scorer = engine_scorer
                return engine_scorer
            self._scorer = load_readability_scorer(self.config, self.pm)
            track("scorer", self._scorer)  # a test (or a user) can check it is gone at each wake
        return self._scorer

    def record_phase(self, stage: Stage, phase: str, started: float, **extra: Any) -> None:
        """Record a finished phase of ``stage`` (started at ``started``) in the run state."""
        self.run_dir.record_phase(stage.name, phase, time.perf_counter() - started, **extra)
        fault_point("phase")

    def generate(self, stage: Stage, model: str, cursor: int, folder: Path, shard: Shard) -> int:
        """Generate and score (or resume) this process's part of the stage's data into ``folder``
        (all of it in one process; the main process also gathers and selects); returns the cursor
        after the stage. What the last training phase held is released first (:func:`release`)."""
        cfg = self.config
        if stage.generate == "none":  # an online backend: it only needs the stage's instances
            if shard.main:
                rows = [p % self.num_train for p in self._indices(cursor, cfg.generation.instances)]
                write_json_atomic(folder / "instances.json", rows)
            return cursor + cfg.generation.instances
        release()
        _use_local_device(shard)
        ctx = GenerationContext(
            task=self.task,
            config=cfg,
            stage=stage,
            folder=folder,
            seed=stage_seed(cfg.seed, stage.name),
            num_train=self.num_train,
            load_policy=lambda: check_stage_engine(self._policy(model), folder, record=shard.main),
            release=self._release,
            env=self._env,
            readability=lambda: self.scorer,
            events=self.pm.hook,
            phase=lambda phase, started, extra: (
                self.record_phase(stage, phase, started, **extra) if shard.main else None
            ),  # only the main process records phases in the run state
            record_time=lambda phase, seconds: (
                self.run_dir.record_time(stage.name, phase, seconds) if shard.main else None
            ),
            progress=self.progress,
            shard=shard,
        )
        if stage.generate == "tree":
            tree_start = cursor + cfg.tree.normalizer_instances
            if not (folder / "pairs.jsonl").is_file():
                generate_tree_stage(
                    ctx,
                    normalizer_indices=self._indices(cursor, cfg.tree.normalizer_instances),
                    tree_positions=list(range(tree_start, tree_start + cfg.tree.instances)),
                )
            return tree_start + cfg.tree.instances
        generate_sample_stage(ctx, indices=self._indices(cursor, cfg.generation.instances), init=stage.init)
        return cursor + cfg.generation.instances


def _use_local_device(shard: Shard) -> None:
    """Under several processes each rank generates on its own GPU, ``cuda:LOCAL_RANK``, the one
    accelerate trains it on (before a stage's training nothing has chosen it yet, and ``"cuda"``
    would put every rank's engine on the first GPU); nothing without CUDA or with one process."""
    if shard.world == 1:
        return
    import torch

    local = int(os.environ.get("LOCAL_RANK", shard.rank))
    if torch.cuda.is_available() and local < torch.cuda.device_count():
        torch.cuda.set_device(local)
