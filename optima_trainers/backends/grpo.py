"""The ``grpo`` trainer backend: TRL's ``GRPOTrainer`` on the Optima reward, from the host loop.

Each iteration is one stage with ``generate="none"``: the host gives it the next
``generation.instances`` training instances; the backend builds one prompt per (instance, trained
agent) (:func:`~optima_trainers.integrations.trl.grpo_prompts`) and trains GRPO online, TRL
calling :class:`~optima_trainers.integrations.trl.OptimaRollout` to play ``generation.num_samples``
conversations per instance with the current weights, score them with the run's ``reward`` and
readability scorer, and return both agents' masked views. Every scored conversation goes to the
``optima_episode_scored`` hook. LoRA (``sft.lora``, ``sft.lora_r``, ``sft.lora_alpha``) is merged
into the checkpoint, written atomically as the other backends' are.

``--set options.train_agents='["Alice"]'`` trains one role while the others speak with the frozen
starting model (a different policy per agent in one run).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from optima_env.errors import TaskContractError, require
from optima_trainers.backends.contract import StageContext, TrainerBackend
from optima_trainers.config.train import TrainConfig
from optima_trainers.run.checkpoint import TrainResult, atomic_checkpoint, require_complete
from optima_trainers.run.stages import Stage, StageData, StageOutcome

__all__ = ["GRPOBackend", "GRPOOptions", "train_grpo_stage"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class GRPOOptions:
    """The options of the ``grpo`` backend (``--set options.NAME=VALUE``)."""

    learning_rate: float = 1e-5
    """Peak learning rate."""
    beta: float = 0.0
    """KL coefficient against the starting model (TRL's default, 0: no reference model)."""
    steps: int | None = None
    """Optimizer steps per iteration (``None``: one pass over the stage's prompts)."""
    prompts_per_step: int = 2
    """(instance, agent) prompts per optimizer step (each gets ``generation.num_samples`` completions)."""
    separate_terms: bool = True
    """Task, token and readability as three reward functions (TRL's multi-objective aggregation)
    instead of their sum."""
    reward_weights: tuple[float, ...] = ()
    """Weights of the reward functions (empty: 1 each)."""
    loss_type: str = "dapo"
    """TRL's GRPO loss (``grpo``, ``dr_grpo``, ``dapo``, ...)."""
    train_agents: tuple[str, ...] = ()
    """The roles that train (empty: every agent); the others speak with the frozen starting model."""

    def __post_init__(self) -> None:
        if not 0 < self.learning_rate < 1:
            raise TaskContractError(f"options.learning_rate must lie in (0, 1), got {self.learning_rate!r}")
        if self.beta < 0:
            raise TaskContractError(f"options.beta must be >= 0, got {self.beta!r}")
        if self.steps is not None and self.steps < 1:
            raise TaskContractError(f"options.steps must be None or >= 1, got {self.steps!r}")
        if self.prompts_per_step < 1:
            raise TaskContractError(f"options.prompts_per_step must be >= 1, got {self.prompts_per_step!r}")


class GRPOBackend(TrainerBackend):
    """``iterations`` online GRPO stages (see the module docstring)."""

    name = "grpo"

    def stages(self, config: TrainConfig) -> list[Stage]:
        return [
            Stage(name=f"iter_{i:02d}", kind="grpo", number=i, generate="none")
            for i in range(config.iterations)
        ]

    def train(self, data: StageData, context: StageContext) -> StageOutcome:
        return train_grpo_stage(data, context)


# size: assembles TRL's GRPOTrainer step by step (rollout function, config, train, atomic save)
def train_grpo_stage(data: StageData, context: StageContext) -> StageOutcome:
    """One GRPO stage on ``data.instances`` from ``context.start_model``; the merged model goes to
    ``context.output_dir``. Readability comes from the host's frozen scorer (one copy per run), and
    every conversation played is reported through ``optima_episode_scored``."""
    torch = require("torch", "train")
    transformers = require("transformers", "train")
    trl = require("trl", "train")
    datasets = require("datasets", "train")
    from optima_env.backends.loading import load_policy
    from optima_trainers.generation.rollouts import episode_summary
    from optima_trainers.integrations.trl import OptimaRollout, grpo_prompts, reward_functions
    from optima_trainers.run.memory import release, track
    from optima_trainers.run.trl import check_report_to, free_trainer, lora_config, world_size

    config, task = context.config, context.task
    start_model, output_dir = context.start_model, context.output_dir
    options = GRPOOptions(**config.options)
    gen = config.generation
    trained = list(options.train_agents or task.agents)
    frozen_agents = [a for a in task.agents if a not in trained]
    prompts = grpo_prompts(task, data.instances, trained)
    check_report_to(config.report_to)
    transformers.set_seed(config.seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(start_model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(start_model, dtype=getattr(torch, config.dtype))
    frozen = {}
    if frozen_agents:
        policy = load_policy(start_model, backend="hf", batch_size=gen.batch_size, dtype=config.dtype)
        frozen = dict.fromkeys(frozen_agents, policy)
    rollout = OptimaRollout(
        task,
        tokenizer=tokenizer,
        num_generations=gen.num_samples,
        sampling=gen.sampling(task.agents, seed=config.seed),
        reward=config.reward,
        readability=context.readability(),
        frozen=frozen,
        seed=config.seed,
        max_turns=gen.max_turns,
        message_format=gen.message_format,
        env_kwargs={"split": config.split},
        on_scored=lambda e: context.events.optima_episode_scored(episode=e, stage=context.stage),
        max_completion_length=config.sft.max_length,
    )
    per_step = options.prompts_per_step * gen.num_samples
    steps = options.steps or max(1, math.ceil(len(prompts) / options.prompts_per_step))
    use_cuda = torch.cuda.is_available()
    funcs = reward_functions(separate_terms=options.separate_terms)
    args = trl.GRPOConfig(
        output_dir=str(data.folder / "trainer"),
        per_device_train_batch_size=per_step,
        gradient_accumulation_steps=1,
        num_generations=gen.num_samples,
        max_completion_length=config.sft.max_length,
        learning_rate=options.learning_rate,
        beta=options.beta,
        loss_type=options.loss_type,
        reward_weights=list(options.reward_weights) or None,
        max_steps=steps,
        lr_scheduler_type="constant",
        bf16=config.dtype == "bfloat16" and use_cuda,
        gradient_checkpointing=False,
        use_cpu=not use_cuda,
        seed=config.seed,
        report_to=config.report_to,
        logging_steps=1,
        save_strategy="no",
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        peft_config=lora_config(config.sft.lora_r, config.sft.lora_alpha) if config.sft.lora else None,
        rollout_func=rollout,
    )
    track("grpo", model, trainer)
    output = trainer.train()
    logged = [h for h in trainer.state.log_history if "reward" in h]
    metrics = {
        f"grpo/{k}": float(v)
        for k, v in (logged[-1] if logged else {}).items()
        if isinstance(v, (int, float))
    }
    played = [e for group in rollout.episodes.values() for e in group]
    metrics.update({**episode_summary(played), "grpo/world_size": float(world_size())})
    result = TrainResult(
        checkpoint=str(output_dir),
        train_loss=float(output.training_loss) if output.global_step else None,
        steps=int(output.global_step),
        num_examples=len(prompts) * gen.num_samples,
        metrics=metrics,
    )
    accelerator = trainer.accelerator
    if accelerator.is_main_process:
        with atomic_checkpoint(output_dir) as (tmp, finish):
            unwrapped = accelerator.unwrap_model(trainer.model)
            (unwrapped.merge_and_unload() if config.sft.lora else unwrapped).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            finish(result)
    accelerator.wait_for_everyone()
    main = accelerator.is_main_process
    free_trainer(trainer)  # the next phase needs the memory back (optima_trainers.run.memory)
    del trainer, model, frozen, rollout
    release()
    written = require_complete(output_dir, verify=False) if main else result  # hashed once, as written
    return StageOutcome(result=written, metrics=metrics)
