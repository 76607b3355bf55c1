"""Generation on OpenAI-compatible vLLM servers (``generation.backend="openai"``): how many
conversations the servers get, and how each stage's weights reach them.

* :func:`servers_in_flight`: ``generation.concurrency``, else :data:`SERVER_CONVERSATIONS` per
  server URL.
* :func:`server_adapter`: a stage checkpoint as one LoRA adapter of the run's starting model. The
  stages' own adapters stacked (:func:`~optima_trainers.run.adapters.stack_adapters`) carry the
  weight change exactly, at the sum of their ranks (the servers need ``--max-lora-rank`` at least
  that). A chain with a stage trained without an adapter (full fine-tuning) falls back to a
  rank-``generation.server_lora_rank`` SVD of the change (:func:`optima_trainers.run.export.export_lora`),
  logged with its relative error; before, every stage went through the SVD, exact only for the
  first stage.
* :func:`delivered`: a plugin's :func:`~optima_trainers.hookspecs.optima_deliver_weights` (full
  fine-tuning: vLLM cannot swap a running server's full weights).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optima_env.errors import ConfigError, DataError, PluginError
from optima_env.io import write_json_atomic

__all__ = [
    "SERVER_CONVERSATIONS",
    "SERVER_LORA_SUFFIX",
    "SERVER_TIMEOUT_S",
    "STACKED_RECORD",
    "delivered",
    "server_adapter",
    "servers_in_flight",
    "stacked_adapter",
]

logger = logging.getLogger(__name__)

SERVER_TIMEOUT_S = 900.0
"""Seconds the trainer waits for one turn from a server (a read timeout is retried, not failed over)."""
SERVER_CONVERSATIONS = 128
"""Conversations in flight per server URL unless ``generation.concurrency`` says otherwise: a vLLM
server batches up to its ``max_num_seqs`` (256 by default on GPUs) and each conversation has one
request in flight at a time, so fewer leave its batch part empty."""
SERVER_LORA_SUFFIX = "-server-lora"
"""The adapter exported for the servers lies beside its checkpoint, named ``<checkpoint>`` + this."""


def servers_in_flight(gen: Any) -> int:
    """Conversations in flight on the servers of ``gen.base_urls``: ``generation.concurrency``, else
    :data:`SERVER_CONVERSATIONS` per URL; fewer than that per URL is logged as a warning."""
    default = SERVER_CONVERSATIONS * len(gen.base_urls)
    if gen.concurrency is None:
        return default
    if gen.concurrency < default:
        logger.warning(
            "generation.concurrency=%d keeps about %.0f conversations in flight per server (%d servers), "
            "where a vLLM server batches up to its max_num_seqs (256 by default on GPUs): the servers "
            "idle; leave generation.concurrency unset (%d per server)",
            gen.concurrency, gen.concurrency / len(gen.base_urls), len(gen.base_urls), SERVER_CONVERSATIONS,
        )  # fmt: skip
    return gen.concurrency


def server_adapter(config: Any, checkpoint: str, chain: tuple[str, ...] | None) -> tuple[str, str]:
    """``(name, folder)`` of the LoRA adapter of ``checkpoint`` minus the starting model,
    written beside the checkpoint (once, under a file lock: the other ranks of a data-parallel
    run, and a rerun, verify and reuse it): the stages' own adapters (``chain``, from
    :attr:`~optima_trainers.generation.engines.PolicyLoader.lineage`) stacked, exact, else (a stage
    trained without an adapter) a rank-``generation.server_lora_rank`` SVD of the weight change."""
    from optima_env.models import file_lock
    from optima_trainers.run.export import export_lora

    gen = config.generation
    out = Path(checkpoint).with_name(Path(checkpoint).name + SERVER_LORA_SUFFIX)
    if chain:
        with file_lock(out.with_name(out.name + ".lock")):
            return stacked_adapter(chain, out, base_model=config.model)
    try:
        with file_lock(out.with_name(out.name + ".lock")):
            manifest = export_lora(
                config.model, checkpoint, out, rank=gen.server_lora_rank, dtype="float32"
            )
    except DataError as exc:
        raise ConfigError(
            f"generation.server_weights=lora cannot carry {checkpoint} as a LoRA adapter of "
            f"{config.model!r}: {exc}. A fully fine-tuned checkpoint reaches vLLM servers through "
            "generation.server_weights=hook and a plugin implementing optima_deliver_weights "
            '(README "Generating on vLLM servers")'
        ) from exc
    error = manifest["delta_relative_error"]["max"]
    logger.info("%s reaches the servers as a rank-%d SVD of its weight change (relative error up to "
                "%.2e): no stage adapter to stack", checkpoint, gen.server_lora_rank, error)  # fmt: skip
    if error > 1e-3:
        logger.warning(
            "the rank-%d adapter of %s approximates its weight change with relative error up to %.2e "
            "(the change has a higher rank); raise generation.server_lora_rank (and the servers' "
            "--max-lora-rank) to generate with the exact weights",
            gen.server_lora_rank,
            checkpoint,
            error,
        )
    return f"optima-{manifest['source_hash'][:16]}", str(out.resolve())



STACKED_RECORD = "stacked.json"
"""Inside a stacked server adapter: the sha256 of each stage adapter's weights it was stacked from."""


def stacked_adapter(chain: tuple[str, ...], out: Path, *, base_model: str) -> tuple[str, str]:
    """``(name, folder)`` of the stage adapters of ``chain`` stacked into one adapter at ``out``
    (kept when ``out`` holds the same stack; else written to a temporary folder and renamed)."""
    from optima_env.backends.peft_adapter import ADAPTER_WEIGHTS, file_sha256
    from optima_trainers.run.adapters import stack_adapters
    from optima_trainers.run.lora_svd import write_adapter

    sources = [file_sha256(Path(a) / ADAPTER_WEIGHTS) for a in chain]
    record = out / STACKED_RECORD
    if not (record.is_file() and json.loads(record.read_text(encoding="utf-8")).get("sources") == sources):
        factors, rank = stack_adapters(chain)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write_adapter(tmp, factors, base_model=base_model, rank=rank)
        write_json_atomic(tmp / STACKED_RECORD, {"sources": sources, "rank": rank, "adapters": list(chain)})
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        logger.info("stacked %d stage adapters (rank %d, exact) into %s", len(chain), rank, out)
    return f"optima-{file_sha256(out / ADAPTER_WEIGHTS)[:16]}", str(out.resolve())


def delivered(pm: Any, checkpoint: str, base_urls: Sequence[str]) -> str:
    """The model name a plugin's ``optima_deliver_weights`` put ``checkpoint`` on the servers as."""
    name = None
    if pm is not None:
        from optima_trainers.hookspecs import add_trainer_hookspecs

        add_trainer_hookspecs(pm)
        name = pm.hook.optima_deliver_weights(checkpoint=checkpoint, base_urls=list(base_urls))
    if name is None:
        raise PluginError(
            f"generation.server_weights=hook, but no plugin delivered {checkpoint} to the servers "
            f"{list(base_urls)}: register one implementing optima_deliver_weights (README "
            '"Generating on vLLM servers"), or use generation.server_weights=lora for LoRA training'
        )
    if not isinstance(name, str) or not name:
        raise PluginError(
            "optima_deliver_weights must return the model name to request (a non-empty str), "
            f"got {name!r}"
        )
    return name


