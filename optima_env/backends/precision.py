"""Decode precision of the transformers engine on CPU: its linear layers in bf16 where the CPU
computes bf16 natively, everything else in fp32; and the record of an engine's numerics.

Why: a decode step of SmolLM2-135M reads 538 MB of fp32 weights, and on a CPU with AVX512_BF16
or AMX the linear layers run about 1.5x faster in bf16 (a batch-32 forward 144 -> 98 ms on this
project's 2-core Xeon), while attention, norms and the small element-wise ops are slower in bf16
(whole-model bf16 is slower than fp32 there). So only ``nn.Linear`` runs in bf16, its input cast
at the layer and its output cast back. The model's own weights stay as they are (a trainer's model
keeps training in its own dtype): the engine keeps bf16 copies, remade when a weight changes, and
routes the linear layers through them only while it decodes (:meth:`Bf16Linears.active`).
:func:`fidelity` measures what it costs: teacher-forced next-token distributions against fp32.

Settings (:data:`PRECISIONS`): ``auto`` picks bf16 linear layers where :func:`cpu_has_native_bf16`
and fp32 elsewhere; ``float32`` and ``bfloat16`` force one. A model that is not fp32 on a CPU
(a GPU, a bf16 model) decodes in its own dtype whatever the setting.

:func:`engine_record` is what episode stores and training records keep of the engine, so that
episodes sampled under one precision or sampler are never taken for another's.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

from optima_env.errors import TaskContractError

__all__ = [
    "LEGACY_ENGINE",
    "PRECISIONS",
    "Bf16Linears",
    "check_precision",
    "cpu_has_native_bf16",
    "engine_record",
    "fidelity",
    "recorded_engine",
    "resolve_precision",
]

PRECISIONS = ("auto", "float32", "bfloat16")
"""Values of the decode precision setting (``auto``: bf16 linear layers where the CPU has native bf16)."""

LEGACY_ENGINE = {"precision": "float32", "sampler": "multinomial"}
"""The engine record of stores written before engines were recorded (fp32, ``torch.multinomial``)."""


def check_precision(precision: object) -> str:
    """``precision`` when it is one of :data:`PRECISIONS`; :class:`TaskContractError` otherwise."""
    if precision not in PRECISIONS:
        raise TaskContractError(
            f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}; e.g. precision='auto'"
        )
    return str(precision)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512_BF16 or AMX tiles), as PyTorch detects it."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def resolve_precision(precision: str, *, dtype: str = "float32", device: str = "cpu") -> str:
    """The precision the linear layers of a ``dtype`` model on ``device`` decode in: the model's own
    dtype off fp32-on-CPU; there, ``auto`` is ``bfloat16`` where :func:`cpu_has_native_bf16`, else
    ``float32``; ``float32`` and ``bfloat16`` as given."""
    check_precision(precision)
    if device != "cpu" or dtype != "float32":
        return dtype
    if precision == "auto":
        return "bfloat16" if cpu_has_native_bf16() else "float32"
    return precision


def engine_record(precision: str, sampler: str, *, greedy: bool = False) -> dict[str, str]:
    """What a store keeps of the engine that generated its episodes: the resolved precision and the
    sampler (``greedy`` for greedy decoding, which no sampler touches)."""
    return {"precision": precision, "sampler": "greedy" if greedy else sampler}


def recorded_engine(metadata: Any, *, greedy: bool) -> dict[str, str]:
    """The engine record in an episode's (or a folder's) ``metadata``; :data:`LEGACY_ENGINE` (fp32,
    ``multinomial``) for one written before engines were recorded."""
    record = metadata.get("engine") if isinstance(metadata, dict) else None
    if isinstance(record, dict):
        return dict(record)
    return engine_record(LEGACY_ENGINE["precision"], LEGACY_ENGINE["sampler"], greedy=greedy)


def _linear_bf16(weight: Any, bias: Any, x: Any) -> Any:
    import torch

    return torch.nn.functional.linear(x.to(torch.bfloat16), weight, bias).to(x.dtype)


class Bf16Linears:
    """bf16 copies of a model's fp32 linear weights, and a context that decodes through them."""

    def __init__(self, model: Any, *, lm_head: bool = False) -> None:
        self.model = model
        self._copies: dict[Any, tuple[tuple[int, int, int], Any, Any]] = {}
        self._skip = None if lm_head else model.get_output_embeddings()

    def _copy(self, module: Any) -> tuple[Any, Any]:
        import torch

        weight = module.weight
        signature = (id(weight), weight._version, weight.data_ptr())
        held = self._copies.get(module)
        if held is None or held[0] != signature:
            with torch.no_grad():
                bias = None if module.bias is None else module.bias.detach().to(torch.bfloat16)
                held = (signature, weight.detach().to(torch.bfloat16), bias)
            self._copies[module] = held
        return held[1], held[2]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Every fp32 ``nn.Linear`` of the model computes with its bf16 copy meanwhile."""
        import torch

        patched = []
        try:
            for module in self.model.modules():
                if (
                    isinstance(module, torch.nn.Linear)
                    and module.weight.dtype == torch.float32
                    and module is not self._skip
                ):
                    weight, bias = self._copy(module)
                    patched.append((module, module.__dict__.get("forward")))
                    module.forward = functools.partial(_linear_bf16, weight, bias)
            yield
        finally:
            for module, previous in patched:
                if previous is None:
                    del module.forward
                else:
                    module.forward = previous


def fidelity(
    model: Any, sequences: Sequence[Sequence[int]], *, temperature: float = 0.7, lm_head: bool = False
) -> dict[str, Any]:
    """Teacher-forced bf16 linear layers against fp32 on ``sequences`` (token ids of task text).

    At every position, the next-token distributions at ``temperature`` of both: the mean total
    variation distance (half the L1 distance), its 99th percentile, and the share of positions
    whose most likely token is the same.
    """
    import torch

    linears = Bf16Linears(model, lm_head=lm_head)
    distances, agree = [], []
    with torch.inference_mode():
        for ids in sequences:
            batch = torch.tensor([list(ids)], dtype=torch.long, device=model.device)
            reference = model(input_ids=batch).logits[0].float()
            with linears.active():
                mixed = model(input_ids=batch).logits[0].float()
            p, q = (reference / temperature).softmax(-1), (mixed / temperature).softmax(-1)
            distances.append(0.5 * (p - q).abs().sum(-1))
            agree.append(reference.argmax(-1) == mixed.argmax(-1))
    tv = torch.cat(distances)
    same = torch.cat(agree)
    return {
        "positions": int(tv.numel()),
        "temperature": temperature,
        "tv_mean": float(tv.mean()),
        "tv_p99": float(tv.quantile(0.99)),
        "top_token_agreement": float(same.float().mean()),
    }
