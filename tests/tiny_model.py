"""The one tiny model of the tests: a randomly initialized 2-layer Llama with the embedded model's
tokenizer (a fast stand-in for a real model), in memory or saved to a folder, in the shape vLLM-CPU
takes, and a "trained" copy of it with known low-rank weight changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_llama(
    tokenizer: Any,
    *,
    seed: int = 0,
    tie_word_embeddings: bool = True,
    vllm_heads: bool = False,
    max_position_embeddings: int = 4096,
    dtype: Any = None,
) -> Any:
    """A 2-layer Llama (random weights from ``seed``) sized to ``tokenizer``, in eval mode: 64 wide
    with 16-wide heads, or with ``vllm_heads`` 128 wide with 64-wide heads (vLLM-CPU's attention
    takes head sizes of 32 and up); cast to ``dtype`` when one is given."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128 if vllm_heads else 64,
        intermediate_size=256 if vllm_heads else 128,
        num_hidden_layers=2,
        num_attention_heads=2 if vllm_heads else 4,
        num_key_value_heads=1 if vllm_heads else 2,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    return model.to(dtype) if dtype is not None else model


def make_tiny_model(
    folder: Path,
    *,
    seed: int = 0,
    tie_word_embeddings: bool = True,
    vllm_heads: bool = False,
    max_position_embeddings: int = 4096,
) -> Path:
    """Save :func:`tiny_llama` and the embedded tokenizer into ``folder`` and return ``folder``."""
    import transformers

    from optima_env.models import ensure_embedded_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(ensure_embedded_model())
    model = tiny_llama(
        tokenizer,
        seed=seed,
        tie_word_embeddings=tie_word_embeddings,
        vllm_heads=vllm_heads,
        max_position_embeddings=max_position_embeddings,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_tiny_vllm_model(folder: Path, *, seed: int = 0, max_position_embeddings: int = 2048) -> Path:
    """:func:`make_tiny_model` in the shape every vLLM test serves: heads vLLM-CPU takes, and an
    output embedding of its own (a random model with tied ones repeats its last token, ``Alice::::``)."""
    return make_tiny_model(
        folder,
        seed=seed,
        vllm_heads=True,
        tie_word_embeddings=False,
        max_position_embeddings=max_position_embeddings,
    )


def add_low_rank_delta(
    base: Path,
    folder: Path,
    *,
    modules: tuple[str, ...] = ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"),
    rank: int = 2,
    scale: float = 0.05,
    seed: int = 0,
    also: dict[str, float] | None = None,
    dtype: str = "float32",
) -> Path:
    """Save a "trained" copy of the model at ``base`` into ``folder``: each linear module of
    ``modules`` gets a known random rank-``rank`` delta ``scale · U Vᵀ``, and each weight named in
    ``also`` (e.g. ``{"model.embed_tokens.weight": 0.1}``) gets dense noise of that size; the
    weights are saved in ``dtype``."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in modules:
            weight = params[f"{name}.weight"]
            u = torch.randn(weight.shape[0], rank, generator=generator)
            v = torch.randn(weight.shape[1], rank, generator=generator)
            weight += scale * (u @ v.T)
        for name, size in (also or {}).items():
            params[name] += size * torch.randn(params[name].shape, generator=generator)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    return folder
