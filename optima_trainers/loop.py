"""The iterative loop: generate → reward → select → train → next model (spec §4-§7).

A run is a list of stages (:func:`plan_stages`):

* ``isft``: SFT stages ``iter_00`` (initialization, spec §4) to ``iter_{K-1}``;
* ``idpo``: the iSFT initialization ``iter_00``, then DPO stages ``iter_01`` .. ``iter_K``;
* ``isft-dpo``: per cycle an SFT stage ``iter_XX_sft`` then a plain-DPO stage ``iter_XX_dpo``.

SFT stage: sample N conversations on each of the next ``instances`` training instances with the
current model (the cursor continues across stages and wraps), add the frozen base model's
readability, score each instance's group (per-instance max normalizer), select through the
``optima_select_training_data`` hook (built-in: :func:`optima_trainers.selection.select_isft`),
train from the base model (initialization; debate tasks every time, spec §5 item 8) or from the
current model. The initialization samples with the format-diverse pool (when the task has one)
at ``init_temperature``; training examples always use the base prompts.

DPO stage: one conversation on each of the next ``normalizer_instances`` instances sets the token
normalizer (percentile + 1, spec §6.3), then one MCTS tree per next ``mcts_instances`` instance,
its pairs, the top half per tree, and DPO (RPO α=1 for iDPO, plain for iSFT-DPO) from the current
model, which is also the reference.

Every phase's output is on disk before the next starts (:mod:`optima_trainers.runs`), so a killed
run resumes where it stopped with the same data as an uninterrupted one.
"""

from __future__ import annotations

import gc
import logging
import os
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy

from optima_env.errors import PluginError, require
from optima_env.io import read_episodes, write_episodes, write_json_atomic
from optima_env.models import resolve_model_path
from optima_env.policy import SamplingParams, speaker_stops
from optima_env.registry import get_plugin_manager, make_task
from optima_env.reward import RewardConfig
from optima_env.rollout import make_jobs
from optima_env.types import Episode
from optima_trainers.checkpoint import (
    TrainResult,
    discard_partial,
    is_complete,
    require_complete,
    train_metrics,
)
from optima_trainers.config import TrainConfig
from optima_trainers.faults import fault_point
from optima_trainers.generation import (
    episode_summary,
    load_policy,
    resumable_rollout,
    score_episodes,
    with_readability,
)
from optima_trainers.runs import RunDir, read_stage_result
from optima_trainers.selection import SelectionConfig

__all__ = ["IterativeTrainer", "Stage", "plan_stages", "stage_seed"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """One training stage of a run."""

    name: str
    """Folder name (``iter_00``, ``iter_01_dpo``, ...)."""
    kind: str
    """``sft`` or ``dpo``."""
    number: int
    """Position in the run (the ``iteration`` of the hooks)."""
    init: bool = False
    """The initialization stage (format-diverse pool, base model start)."""


def plan_stages(config: TrainConfig) -> list[Stage]:
    """The stages of a run (see the module docstring)."""
    k = config.iterations
    if config.trainer == "isft":
        return [Stage(name=f"iter_{i:02d}", kind="sft", number=i, init=i == 0) for i in range(k)]
    if config.trainer == "idpo":
        return [Stage(name="iter_00", kind="sft", number=0, init=True)] + [
            Stage(name=f"iter_{i:02d}", kind="dpo", number=i) for i in range(1, k + 1)
        ]
    stages = []
    for c in range(k):
        stages.append(Stage(name=f"iter_{c:02d}_sft", kind="sft", number=2 * c, init=c == 0))
        stages.append(Stage(name=f"iter_{c:02d}_dpo", kind="dpo", number=2 * c + 1))
    return stages


def stage_seed(seed: int, stage: str) -> int:
    """The seed of one stage's jobs and sampling (31 bits).

    >>> stage_seed(0, "iter_00") == stage_seed(0, "iter_00") != stage_seed(0, "iter_01")
    True
    """
    return zlib.crc32(f"optima-stage/{seed}/{stage}".encode()) & 0x7FFFFFFF


def _builtin_plugin(pm: pluggy.PluginManager) -> None:
    from optima_trainers import plugin

    if not pm.is_registered(plugin) and pm.get_plugin("optima_trainers") is None:
        pm.register(plugin, name="optima_trainers")


class IterativeTrainer:
    """Runs (or resumes) the stages of one training run.

    Args:
        config: the run configuration.
        run_dir: the run folder (:meth:`RunDir.create` or :meth:`RunDir.open`).
        pm: plugin manager whose hooks are fired (default: a fresh one with entry points); the
            built-in selection plugin is registered on it if missing.
        progress: show tqdm progress bars.
    """

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
        self.progress = progress
        self.task = make_task(config.task, pm=self.pm, **dict(config.task_kwargs))
        self.num_train = len(self.task.samples(config.split))
        self.base_model = resolve_model_path(config.model)
        self._scorer: Any = None

    # -- driver ---------------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        """Run every stage not finished yet; returns the metrics of every stage.

        Under ``accelerate launch`` with several processes, the main process generates, scores
        and selects; the others wait for each stage's training data on disk, then all of them
        train together (:meth:`_follow`).
        """
        if _rank() != 0:
            return self._follow()
        with self.run_dir.lock():
            self.pm.hook.optima_configure.call_historic(kwargs={"config": self.config.to_dict()})
            model, cursor = self.base_model, 0
            for stage in plan_stages(self.config):
                done = self.run_dir.root / stage.name / "result.json"
                if done.is_file():
                    record = read_stage_result(done)
                else:
                    self.pm.hook.optima_iteration_start(iteration=stage.number, config=self.config.to_dict())
                    self._verify_model(model)
                    runner = self._sft_stage if stage.kind == "sft" else self._dpo_stage
                    record = runner(stage, model, cursor)
                    record = {**record, "model": self.run_dir.portable(record["model"])}
                    write_json_atomic(done, record)
                    self.run_dir.save_state(stage=stage.name, phase="done", model=record["model"])
                    self.pm.hook.optima_iteration_end(iteration=stage.number, metrics=record["metrics"])
                self.run_dir.append_metrics({"stage": stage.name, "kind": stage.kind, **record["metrics"]})
                model, cursor = self.run_dir.model_path(record["model"]), record["cursor_end"]
            self.run_dir.save_state(status="finished", model=model)
        return self.run_dir.metrics()

    def _follow(self) -> list[dict[str, Any]]:
        """A non-main process: train each stage on the data the main process wrote."""
        from optima_trainers.dpo_stage import train_dpo_stage
        from optima_trainers.types import read_pairs

        model = self.base_model
        for stage in plan_stages(self.config):
            folder = self.run_dir.root / stage.name
            done = folder / "result.json"
            if not done.is_file():
                self._verify_model(model)
                if stage.kind == "sft":
                    selected = read_episodes(_wait_for(folder / "selected.jsonl", done))
                    start = self.base_model if stage.init or self.config.restart_from_base else model
                    self._train_sft(folder, start, selected)
                else:
                    train_dpo_stage(self, folder, model, read_pairs(_wait_for(folder / "pairs.jsonl", done)))
                _wait_for(done)
            model = self.run_dir.model_path(read_stage_result(done)["model"])
        return self.run_dir.metrics()

    def _verify_model(self, model: str) -> None:
        """Verify a checkpoint before a stage loads it: one of this run's (it must be complete),
        or any folder with a ``COMPLETE`` marker. A corrupt one raises
        :class:`~optima_trainers.checkpoint.CorruptCheckpointError`: the run stops, nothing is deleted."""
        path = Path(model)
        if is_complete(path) or (path.is_absolute() and path.is_relative_to(self.run_dir.root)):
            require_complete(path)

    def _indices(self, start: int, count: int) -> list[int]:
        return [(start + j) % self.num_train for j in range(count)]

    def _env_kwargs(self, policy: Any, *, diverse: bool = False) -> dict[str, Any]:
        return dict(
            split=self.config.split,
            max_turns=self.config.max_turns,
            tokenizer=getattr(policy, "tokenizer", None),
            diverse_formats=diverse,
            message_format=self.config.message_format,
            pm=self.pm,
        )

    def _policy(self, model: str) -> Any:
        return load_policy(
            model, backend=self.config.backend, concurrency=self.config.concurrency, dtype=self.config.dtype
        )

    @staticmethod
    def _release(policy: Any) -> None:
        close = getattr(policy, "close", None)
        if callable(close):
            close()
        del policy
        gc.collect()

    @property
    def stops(self) -> tuple[str, ...]:
        """Stop strings of every generated turn (the agents' tags when ``stop_at_speaker_tags``)."""
        return speaker_stops(self.task.agents) if self.config.stop_at_speaker_tags else ()

    @property
    def scorer(self) -> Any:
        """The frozen base model's per-turn LM loss (loaded once, kept for the whole run)."""
        if self._scorer is None:
            from optima_env.readability import TransformersLMLoss

            self._scorer = TransformersLMLoss.from_pretrained(
                self.config.readability_model or self.config.model, dtype=self.config.dtype
            )
        return self._scorer

    def _reward_config(self, *, lambda_token: float, lambda_loss: float, impersonation: str) -> RewardConfig:
        extra = {"impersonation": impersonation} if self.config.reward_preset == "code" else {}
        return RewardConfig.preset(
            self.config.reward_preset, lambda_token=lambda_token, lambda_loss=lambda_loss, **extra
        )

    def _phase(self, stage: Stage, phase: str, started: float, **extra: Any) -> None:
        self.run_dir.record_phase(stage.name, phase, time.perf_counter() - started, **extra)
        fault_point("phase")

    # -- SFT stage --------------------------------------------------------------------------------
    def _sft_stage(self, stage: Stage, model: str, cursor: int) -> dict[str, Any]:
        cfg, folder = self.config, self.run_dir.stage(stage.name)
        seed = stage_seed(cfg.seed, stage.name)
        indices = self._indices(cursor, cfg.instances)
        scored_path, selected_path = folder / "scored.jsonl", folder / "selected.jsonl"
        if not scored_path.is_file():
            started = time.perf_counter()
            policy = self._policy(model)
            diverse = stage.init and cfg.diverse_init and self.task.num_formats > 0
            episodes = resumable_rollout(
                self.task,
                policy,
                jobs=make_jobs(indices, cfg.num_samples, seed),
                path=folder / "episodes.jsonl",
                sampling=SamplingParams(
                    temperature=cfg.init_temperature if stage.init else cfg.temperature,
                    top_p=cfg.top_p,
                    max_new_tokens=cfg.max_new_tokens,
                    seed=seed,
                    stop=self.stops,
                ),
                env_kwargs=self._env_kwargs(policy, diverse=diverse),
                concurrency=cfg.concurrency,
                progress=self.progress,
            )
            self._release(policy)
            self._phase(stage, "generate", started, cursor=cursor)
            started = time.perf_counter()
            reward = self._reward_config(
                lambda_token=cfg.sft_lambda_token, lambda_loss=cfg.sft_lambda_loss, impersonation="sft"
            )
            scored = score_episodes(with_readability(episodes, self.scorer), config=reward)
            write_episodes(scored_path, scored)
            self._phase(stage, "score", started)
        scored = read_episodes(scored_path)
        if not selected_path.is_file():
            started = time.perf_counter()
            write_episodes(selected_path, self._select(stage, scored))
            self._phase(stage, "select", started)
        selected = read_episodes(selected_path)

        start_model = self.base_model if stage.init or cfg.restart_from_base else model
        started = time.perf_counter()
        result, counts = self._train_sft(folder, start_model, selected)
        self._phase(stage, "train", started)
        metrics = {
            **episode_summary(scored),
            "select/instances": float(len({e.sample_id for e in scored})),
            "select/selected": float(len(selected)),
            "select/reward": _mean([e.reward.total for e in selected if e.reward is not None]),
            "select/task_score": _mean([e.task_score for e in selected]),
            "select/tokens": _mean([float(e.num_tokens) for e in selected]),
            **{f"train/{k}": float(v) for k, v in counts.items()},
            **train_metrics(result),
            **{f"time/{k}_s": v for k, v in self.run_dir.timings(stage.name).items()},
        }
        return {
            "model": result.checkpoint if result else model,
            "cursor_end": cursor + cfg.instances,
            "metrics": {"iteration": float(stage.number), **metrics},
        }

    def _select(self, stage: Stage, scored: Sequence[Episode]) -> list[Episode]:
        cfg = self.config
        selection = SelectionConfig(
            theta=cfg.theta_sft,
            keep=tuple(cfg.keep),
            order=cfg.selection_order,
            min_task_score=cfg.min_task_score,
        )
        chosen = self.pm.hook.optima_select_training_data(
            episodes=list(scored),
            trainer=cfg.trainer,
            config={**selection.to_dict(), "stage": stage.name, "task": cfg.task},
        )
        if chosen is None:
            raise PluginError(
                "no plugin answered optima_select_training_data; the built-in one "
                "(optima_trainers.plugin) should: is it unregistered or blocked?"
            )
        if not all(isinstance(e, Episode) for e in chosen):
            raise PluginError("optima_select_training_data must return a list of Episode records")
        return list(chosen)

    def _train_sft(
        self, folder: Path, start_model: str, selected: Sequence[Episode]
    ) -> tuple[TrainResult | None, dict[str, int]]:
        from optima_trainers.sft import SFTTrainConfig, train_sft
        from optima_trainers.sft_data import build_sft_examples

        cfg, checkpoint = self.config, folder / "checkpoint"
        transformers = require("transformers", "train")
        tokenizer = transformers.AutoTokenizer.from_pretrained(start_model)
        examples, counts = build_sft_examples(
            selected,
            tokenizer,
            message_format=cfg.message_format,
            max_length=cfg.sft_max_length,
            seed=cfg.seed,
        )
        if is_complete(checkpoint):
            return require_complete(checkpoint), counts
        discard_partial(checkpoint)
        if not examples:
            logger.warning(
                "%s: no training example was selected; the model carries over unchanged", folder.name
            )
            return None, counts
        held_out = int(cfg.eval_fraction * len(examples))
        result = train_sft(
            model_path=start_model,
            examples=examples[held_out:],
            eval_examples=examples[:held_out],
            config=SFTTrainConfig(
                learning_rate=cfg.sft_lr,
                epochs=cfg.sft_epochs,
                batch_size=cfg.sft_batch_size,
                per_device_batch_size=cfg.per_device_batch_size,
                max_length=cfg.sft_max_length,
                max_steps=cfg.max_steps,
                lora=cfg.lora,
                lora_r=cfg.lora_r,
                lora_alpha=cfg.lora_alpha,
                warmup_ratio=cfg.warmup_ratio,
                seed=cfg.seed,
                report_to=cfg.report_to,
                dtype=cfg.dtype,
            ),
            output_dir=checkpoint,
            logging_dir=folder / "trainer",
        )
        return result, counts

    # -- DPO stage --------------------------------------------------------------------------------
    def _dpo_stage(self, stage: Stage, model: str, cursor: int) -> dict[str, Any]:
        from optima_trainers.dpo_stage import run_dpo_stage

        return run_dpo_stage(self, stage, model, cursor)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _wait_for(path: Path, *alternatives: Path, poll_s: float = 5.0) -> Path:
    """Block until ``path`` (or one of ``alternatives``) exists; returns ``path``."""
    while not path.exists() and not any(a.exists() for a in alternatives):
        time.sleep(poll_s)
    return path


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0
