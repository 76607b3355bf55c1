"""A tiny randomly initialized Llama with the embedded model's tokenizer (fast stand-in for tests)."""

from __future__ import annotations

from pathlib import Path


def make_tiny_model(folder: Path, *, seed: int = 0, tie_word_embeddings: bool = True) -> Path:
    """Save a 2-layer, 64-wide Llama (random weights) and the embedded tokenizer into ``folder``."""
    import torch
    import transformers

    from optima_env.models import ensure_embedded_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(ensure_embedded_model())
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
