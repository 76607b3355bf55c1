"""Decode precision of the transformers engine on CPU: its linear layers and its LM head in bf16
where the CPU computes bf16 natively, the LM head's most likely logits recomputed in fp32,
everything else (the KV cache and attention included) in fp32; and the record of an engine's
numerics.

Why: a decode step of SmolLM2-135M reads 538 MB of fp32 weights; on a CPU with AVX512_BF16 or AMX
the linear layers run about 1.5x faster in bf16, while attention, norms and the small
element-wise ops are slower in bf16 (whole-model bf16 is slower than fp32 there). So only the
``nn.Linear`` layers compute in bf16, each input cast at the layer and its output cast back; the
LM head too, with every logit of a row at least its :data:`EXACT_TOP`-th largest recomputed in fp32
(a plain bf16 LM head moved the next-token distributions too far from fp32's; the tokens that hold
nearly all of a row's mass come out as fp32 gives them). The KV states stay in fp32: a bf16 KV
cache halves the bytes attention reads, but that did not make attention faster on this
project's CPU model (AMD Zen 4, AVX512_BF16). On one virtual machine bf16 attention was the
faster; on two others torch's ``scaled_dot_product_attention`` with ``enable_gqa`` (the engine's
kernel, :func:`~optima_env.backends._kv.gqa_attention`) took several times fp32's time in bf16
(the rollout suite's ``floor`` phase times both), and the whole decode ran at half its speed;
there, the same attention with the query heads grouped by KV head (no ``enable_gqa``) took
about fp32's time in bf16, not less. An fp32 cache loses nothing where bf16 attention is slow,
reads twice the bytes where it is fast (the suite's floor prices that), and its next-token
distributions are the closer to fp32's (``bf16_kv`` in :data:`FIDELITY_VARIANTS`).
The model's own weights stay as they are (a trainer's model keeps training in its own dtype): the
engine keeps bf16 copies, remade when a weight changes, and routes the linear layers through them
only while it decodes (:meth:`Bf16Linears.active`). :func:`fidelity` measures what it costs:
teacher-forced next-token distributions against fp32, for the engine and for each of its parts.

Batch shapes: this CPU's GEMMs (oneDNN, MKL) pick their kernel by the number of rows, so a row's
logits differ in the last bits with the rows beside it, in fp32 too. In fp32 those differences
almost never flip a sampled token, so a seeded request samples the same text in any batch
(the tests that data-parallel shards equal one process and that a streamed reply equals
``generate``'s run in ``float32``); in bf16 they are a bf16 rounding step and sometimes flip a
token, so the same seed gives the same episodes only in the same batch. ``float32`` is the setting
for runs that must replay bit for bit across process counts or a resume.

Settings (:data:`PRECISIONS`): ``auto`` picks bf16 where :func:`cpu_has_native_bf16` and fp32
elsewhere; ``float32`` and ``bfloat16`` force one. A model that is not fp32 on a CPU (a GPU, a
bf16 model) decodes in its own dtype whatever the setting.

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
    "EXACT_TOP",
    "LEGACY_ENGINE",
    "MIXED",
    "PRECISIONS",
    "Bf16Linears",
    "check_precision",
    "cpu_has_native_bf16",
    "engine_record",
    "fidelity",
    "recorded_engine",
    "recorded_kv_dtype",
    "resolve_precision",
]

PRECISIONS = ("auto", "float32", "bfloat16")
"""Values of the decode precision setting (``auto``: bf16 decode where the CPU has native bf16)."""

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


EXACT_TOP = 64
"""Logits per row that the bf16 LM head recomputes in fp32: the most likely ones (:class:`Bf16Linears`)."""


MIXED = 3
"""Version of the mixed bf16 decode (the module docstring), in the records of its episodes: 3 runs
the linear layers and the LM head (top recomputed in fp32) in bf16, the KV cache in fp32; 2 also
kept the KV cache in bf16, 1 ran the linear layers but the LM head only (no engine decodes so any
more)."""


def recorded_kv_dtype(record: dict[str, Any]) -> str:
    """The dtype of the KV states an engine record's episodes were decoded over: the recorded
    precision for a model decoding in its own dtype; for an fp32 model decoding in bf16, fp32,
    but bf16 under :data:`MIXED` version 2."""
    mixed = record.get("mixed")
    if mixed is None:
        return str(record.get("precision", ""))
    return "bfloat16" if mixed == 2 else "float32"


def engine_record(
    precision: str, sampler: str, *, greedy: bool = False, mixed: bool = False
) -> dict[str, Any]:
    """What a store keeps of the engine that generated its episodes: the resolved precision, the
    sampler (``greedy`` for greedy decoding, which no sampler touches) and, for an fp32 model
    decoding in bf16 (``mixed``), the :data:`MIXED` version."""
    record: dict[str, Any] = {"precision": precision, "sampler": "greedy" if greedy else sampler}
    if mixed:
        record["mixed"] = MIXED
    return record


def recorded_engine(metadata: Any, *, greedy: bool) -> dict[str, str]:
    """The engine record in an episode's (or a folder's) ``metadata``; :data:`LEGACY_ENGINE` (fp32,
    ``multinomial``) for one written before engines were recorded."""
    record = metadata.get("engine") if isinstance(metadata, dict) else None
    if isinstance(record, dict):
        return dict(record)
    return engine_record(LEGACY_ENGINE["precision"], LEGACY_ENGINE["sampler"], greedy=greedy)


_PACK_ROWS = 32
"""Batch rows oneDNN is told to expect when it lays out a bf16 weight (:func:`_packed`): a decode
batch. On this project's CPU, 4 and 32 gave the layout of its plain bf16 matmul (the same results
at 1 to 512 rows with one thread, up to 256 with two: :data:`_PROBE_ROWS`); 1 gave another, whose
results differ from 33 rows on."""

_PROBE_ROWS = (1, 7, 64, 256)
"""Input rows at which a packed weight's results are checked against ``F.linear``'s (:func:`_packed`);
the packed weight computes inputs of at most the last of them, ``F.linear`` larger ones (with 2
threads, ``F.linear`` switched kernels between 256 and 480 rows)."""


def _linear_bf16(matmul: Any, weight: Any, bias: Any, x: Any) -> Any:
    import torch

    return matmul(x.to(torch.bfloat16), weight, bias).to(x.dtype)


class _Onednn:
    """``F.linear`` of one bf16 weight: over its :func:`_packed` twin for inputs of at most
    ``_PROBE_ROWS[-1]`` rows, over the plain weight beyond (where the two part ways)."""

    def __init__(self, plain: Any, packed: Any) -> None:
        self.plain, self.packed = plain, packed

    def __call__(self, x: Any, weight: Any, bias: Any) -> Any:
        import torch

        if x.numel() > _PROBE_ROWS[-1] * x.shape[-1]:
            return torch.nn.functional.linear(x, self.plain, bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [None], "")


_PACK_CHECKED: dict[tuple[Any, ...], bool] = {}
"""Whether packed weights give ``F.linear``'s results, per weight shape, bias and torch threads
(:func:`_packed`)."""


def _packed(weight: Any, bias: Any) -> Any:
    """An :class:`_Onednn` over ``weight`` (bf16, on CPU) laid out once in oneDNN's blocked format
    for its bf16 matmul, or None where this torch cannot, or where a packed weight's results
    differ from ``F.linear``'s by a bit at any of :data:`_PROBE_ROWS` rows (with this process's
    torch threads: the copies are remade when they change, :class:`Bf16Linears`).

    Why: ``F.linear`` in bf16 gives oneDNN the plain weight at every call; packed once into the
    layout its kernel reads, the model's linear layers run a decode step at small batches
    markedly faster on this project's CPU (the rollout suite's ``floor`` phase times the path the
    engine takes). The layout is the one oneDNN's matmul uses for the plain weight, so
    the results are the same bit for bit. That is checked here, so that a build that lays out
    otherwise keeps ``F.linear``: once per weight shape, bias and thread count
    (:data:`_PACK_CHECKED`), which is what oneDNN picks its kernels by, not the weights' values;
    a model's layers share a few shapes, and a training run repacks every weight at each stage.
    """
    import torch

    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    key = (tuple(weight.shape), bias is not None, torch.get_num_threads())
    if _PACK_CHECKED.get(key) is False:
        return None
    try:
        matmul = _Onednn(weight, torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS))
        if key not in _PACK_CHECKED:
            generator = torch.Generator().manual_seed(0)
            probes = (
                torch.randn(rows, weight.shape[1], generator=generator).to(torch.bfloat16)
                for rows in _PROBE_ROWS
            )
            _PACK_CHECKED[key] = all(
                torch.equal(matmul(x, weight, bias), torch.nn.functional.linear(x, weight, bias))
                for x in probes
            )
    except (AttributeError, RuntimeError, NotImplementedError):  # no such op or layout in this torch
        _PACK_CHECKED[key] = False
    return matmul if _PACK_CHECKED[key] else None


def _head_bf16(head: Any, matmul: Any, weight: Any, bias: Any, exact_top: int, x: Any) -> Any:
    """The LM head's logits in bf16, then every logit of a row at least its ``exact_top``-th largest
    recomputed in fp32 from ``head``'s own weights (the tokens that hold nearly all of a row's mass
    come out as the fp32 head gives them; the tail keeps bf16's error). The set is chosen by value,
    ties included, not by how ``topk`` breaks ties. ``x`` is taken as rows (a prefill's last
    positions are a strided view, which ``F.linear`` would run as a batched matmul over a copy of
    the whole weight)."""
    import torch

    rows = x.reshape(-1, x.shape[-1])
    flat = matmul(rows.to(torch.bfloat16), weight, bias).to(x.dtype)
    logits = flat.view(*x.shape[:-1], flat.shape[-1])
    if exact_top <= 0:
        return logits
    kth = flat.topk(min(exact_top, flat.shape[-1]), dim=-1).values[:, -1:]
    index, tokens = (flat >= kth).nonzero(as_tuple=True)
    exact = (rows[index] * head.weight[tokens]).sum(-1)
    if head.bias is not None:
        exact = exact + head.bias[tokens]
    flat[index, tokens] = exact.to(flat.dtype)
    return logits


class Bf16Linears:
    """bf16 copies of a model's fp32 linear weights, and a context that decodes through them.

    The LM head computes in bf16 too, its ``exact_top`` largest logits per row recomputed in fp32
    (0: none); ``lm_head=False`` keeps it in fp32, for :func:`fidelity`'s parts of the engine. The
    copies are packed for oneDNN where that gives ``F.linear``'s results (:func:`_packed`).
    """

    def __init__(self, model: Any, *, lm_head: bool = True, exact_top: int = EXACT_TOP) -> None:
        self.model = model
        self._copies: dict[Any, tuple[tuple[int, ...], Any, Any, Any]] = {}
        self._head = model.get_output_embeddings()
        self._lm_head = lm_head
        self.exact_top = exact_top

    def _copy(self, module: Any) -> tuple[Any, Any, Any]:
        """``(matmul, weight, bias)`` of ``module`` in bf16: the held copies, remade when its
        weight or torch's thread count changed; ``matmul(x, weight, bias)`` is ``F.linear`` or an
        :class:`_Onednn` (which also holds the packed weight)."""
        import torch

        weight = module.weight
        signature = (id(weight), weight._version, weight.data_ptr(), torch.get_num_threads())
        held = self._copies.get(module)
        if held is None or held[0] != signature:
            with torch.no_grad():
                bias = None if module.bias is None else module.bias.detach().to(torch.bfloat16)
                plain = weight.detach().to(torch.bfloat16)
                matmul = _packed(plain, bias) or torch.nn.functional.linear
                held = (signature, matmul, plain, bias)
            self._copies[module] = held
        return held[1], held[2], held[3]

    def forward_of(self, module: Any) -> Any:
        """What ``module`` (an fp32 ``nn.Linear`` other than the LM head) computes meanwhile
        :meth:`active`: ``x`` (fp32) through its bf16 copy, the output cast back."""
        return functools.partial(_linear_bf16, *self._copy(module))

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Every fp32 ``nn.Linear`` of the model computes with its bf16 copy meanwhile."""
        import torch

        patched = []
        try:
            for module in self.model.modules():
                if not isinstance(module, torch.nn.Linear) or module.weight.dtype != torch.float32:
                    continue
                if module is self._head and not self._lm_head:
                    continue
                patched.append((module, module.__dict__.get("forward")))
                if module is self._head:
                    module.forward = functools.partial(
                        _head_bf16, module, *self._copy(module), self.exact_top
                    )
                else:
                    module.forward = self.forward_of(module)
            yield
        finally:
            for module, previous in patched:
                if previous is None:
                    del module.forward
                else:
                    module.forward = previous


FIDELITY_VARIANTS = {
    "engine": {"lm_head": True, "exact_top": EXACT_TOP, "kv_cache": "float32"},
    "linears": {"lm_head": False, "exact_top": 0, "kv_cache": "float32"},
    "plain_lm_head": {"lm_head": True, "exact_top": 0, "kv_cache": "float32"},
    "bf16_kv": {"lm_head": True, "exact_top": EXACT_TOP, "kv_cache": "bfloat16"},
}
"""What :func:`fidelity` runs in bf16 per variant: ``engine`` is precision ``bfloat16`` (the linear
layers and the LM head with its top in fp32; the KV cache in fp32); ``linears`` the linear layers
only (:data:`MIXED` version 1); ``plain_lm_head`` a bf16 LM head without the fp32 top, and
``bf16_kv`` the engine with a bf16 KV cache (version 2), which the engine does not use."""


def fidelity(model: Any, sequences: Sequence[Sequence[int]], *, temperature: float = 0.7) -> dict[str, Any]:
    """Teacher-forced bf16 decoding against fp32 on ``sequences`` (token ids of task text), per
    variant of :data:`FIDELITY_VARIANTS`; the ``engine`` variant's figures also at the top level.

    The fp32 reference is the model's own forward; each variant runs the engine's forward (its
    attention, its KV buffer in the variant's dtype, bf16 linear layers). At every position, the
    next-token distributions at ``temperature`` of both: the mean total variation distance (half
    the L1 distance), its 99th percentile, and the share of positions whose most likely token is
    the same.
    """
    import torch

    distances: dict[str, list[Any]] = {name: [] for name in FIDELITY_VARIANTS}
    agree: dict[str, list[Any]] = {name: [] for name in FIDELITY_VARIANTS}
    engines = {
        name: Bf16Linears(model, lm_head=variant["lm_head"], exact_top=variant["exact_top"])
        for name, variant in FIDELITY_VARIANTS.items()
    }
    with torch.inference_mode():
        for ids in sequences:
            batch = torch.tensor([list(ids)], dtype=torch.long, device=model.device)
            reference = model(input_ids=batch).logits[0].float()
            p = (reference / temperature).softmax(-1)
            for name, variant in FIDELITY_VARIANTS.items():
                with engines[name].active():
                    mixed = _engine_forward(model, batch, getattr(torch, variant["kv_cache"]))
                q = (mixed / temperature).softmax(-1)
                distances[name].append(0.5 * (p - q).abs().sum(-1))
                agree[name].append(reference.argmax(-1) == mixed.argmax(-1))
    variants = {}
    for name in FIDELITY_VARIANTS:
        tv, same = torch.cat(distances[name]), torch.cat(agree[name])
        variants[name] = {
            "tv_mean": float(tv.mean()),
            "tv_p99": float(tv.quantile(0.99)),
            "top_token_agreement": float(same.float().mean()),
        }
    return {
        "positions": int(sum(len(ids) for ids in sequences)),
        "temperature": temperature,
        **variants["engine"],
        "variants": variants,
    }


def _engine_forward(model: Any, batch: Any, kv_dtype: Any) -> Any:
    """The logits of ``batch`` (one row) through the engine's attention over a ``kv_dtype`` KV buffer."""
    import torch

    from optima_env.backends import _kv

    layers, kv_heads, head_dim = _kv.kv_geometry(model)
    length = batch.shape[1]
    buf = torch.zeros(layers, 2, 1, kv_heads, length, head_dim, dtype=kv_dtype, device=model.device)
    allowed = torch.ones(length, length, dtype=torch.bool, device=model.device).tril()
    mask = torch.zeros(1, 1, length, length, dtype=kv_dtype, device=model.device)
    mask.masked_fill_(~allowed, _kv.NEG)
    positions = torch.arange(length, device=model.device)[None]
    with _kv.gqa_attention_for(model):
        out = model(
            input_ids=batch,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=_kv.BatchKV(buf, 0).cache(),
            use_cache=True,
        )
    return out.logits[0].float()
