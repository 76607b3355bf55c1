"""Shared fixtures of the transformers-engine tests: the embedded model's tokenizer and the tiny
random Llama (:func:`tests.tiny_model.tiny_llama`, untied embeddings) built on it, once per test
module; each skips without transformers (and torch)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The embedded model's tokenizer, with its real chat template."""
    transformers = pytest.importorskip("transformers")
    from optima_env.models import ensure_embedded_model

    return transformers.AutoTokenizer.from_pretrained(ensure_embedded_model())


@pytest.fixture(scope="module")
def tiny(tokenizer: Any) -> Any:
    """A 2-layer random Llama sized to :func:`tokenizer`, in eval mode."""
    pytest.importorskip("torch")
    from tests.tiny_model import tiny_llama

    return tiny_llama(tokenizer, tie_word_embeddings=False)
