"""The readability term scored through CTranslate2: ``Generator.score_batch`` on each turn alone.

:class:`CTranslate2LMLoss` scores exactly what :class:`~optima_env.readability.TransformersLMLoss`
scores (:func:`~optima_env.readability.turn_template`: one assistant message rendered with the
chat template, the mean loss over its content tokens and end-of-turn marker), from the per-token
log-likelihoods that ``score_batch`` returns. It is registered as ``ct2`` through the
``optima_register_readability_scorers`` hook, beside ``transformers``.

Measured against the fp32 transformers loss on real turns (two sets of 48, the embedded model
playing ``ie/synth-v0`` at T=0.7 with 48 new tokens per turn;
``test_readability_through_ct2_against_fp32_transformers`` in
``tests/optima_env/test_backends_ct2.py``, CTranslate2 4.8.5, SmolLM2-135M-Instruct):

=============  ==================  ================  ====================================
compute type   mean |difference|   max |difference|  48 synthetic turns, 1 thread (shared)
=============  ==================  ================  ====================================
float32        1.3e-4              1.6e-4            13.6 s (transformers fp32: 17.5 s)
int8           0.062 - 0.074       0.20 - 0.28       7.3 s
=============  ==================  ================  ====================================

The default is ``float32``: it gives the transformers loss to within 2e-4 nats, so rewards, the
data selection and the MCTS normalizer stay what they are under the transformers scorer, and it
is still a little faster. int8 is about twice as fast again but moves a turn's loss by about
0.07 nats on average and up to 0.28; choose it with ``compute_type="int8"`` where scoring time
matters more than a reward that differs from the transformers one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optima_env.errors import BackendError, ScoringError, TaskContractError, require
from optima_env.hookspecs import hookimpl
from optima_env.readability import turn_template
from optima_env.registry import ReadabilitySpec

__all__ = ["DEFAULT_COMPUTE_TYPE", "CTranslate2LMLoss", "optima_register_readability_scorers"]

DEFAULT_COMPUTE_TYPE = "float32"
"""The scorer's default weights (see the measurement above)."""


class CTranslate2LMLoss:
    """Per-turn mean LM loss under a frozen model, through ``ctranslate2.Generator.score_batch``.

    Args:
        model_dir: a CTranslate2 model folder (:func:`~optima_env.backends.ct2_convert.convert_model`).
        tokenizer: its Hugging Face tokenizer (fast; default: the one saved in ``model_dir``).
        compute_type: ``float32`` (the default), ``int8``, ``int8_float32``, ...
        intra_threads: OpenMP threads (0: CTranslate2's default).
        batch_size: turns per scoring batch.
        max_length: longest scored sequence in tokens (longer turns are truncated on the right).
        system: as :class:`~optima_env.readability.TransformersLMLoss` (``"none"``: no system
            prompt, a template's injected default removed; ``"template"``: kept), so that both
            scorers render a turn identically.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        tokenizer: Any = None,
        *,
        compute_type: str = DEFAULT_COMPUTE_TYPE,
        intra_threads: int = 0,
        batch_size: int = 16,
        max_length: int = 2048,
        system: str = "none",
    ) -> None:
        ctranslate2 = require("ctranslate2", "ct2")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise TaskContractError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if tokenizer is None:
            tokenizer = require("transformers", "train").AutoTokenizer.from_pretrained(Path(model_dir))
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.system = system
        self._prefix, self._suffix_scored, self._suffix_rest = turn_template(tokenizer, system=system)
        try:
            self.generator = ctranslate2.Generator(
                str(model_dir), device="cpu", compute_type=compute_type, intra_threads=intra_threads
            )
        except Exception as exc:
            raise BackendError(
                f"CTranslate2 could not load {model_dir} ({type(exc).__name__}: {exc})"
            ) from exc

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str = "embedded",
        *,
        compute_type: str = DEFAULT_COMPUTE_TYPE,
        cache_root: str | os.PathLike[str] | None = None,
        dtype: str | None = None,
        **kwargs: Any,
    ) -> CTranslate2LMLoss:
        """Convert the frozen base model once (cached by content hash) and load it. ``dtype`` (the
        torch dtype every readability factory receives) is unused: ``compute_type`` sets the weights."""
        require("ctranslate2", "ct2")
        from optima_env.backends.ct2_convert import convert_model

        folder = convert_model(name_or_path, compute_type=compute_type, root=cache_root)
        return cls(folder, compute_type=compute_type, **kwargs)

    def __call__(self, texts: Sequence[str]) -> list[float]:
        """The mean content-token loss of each text (same order)."""
        if not texts:
            return []
        contents = [t.strip() for t in texts]
        enc = self.tokenizer(
            [self._prefix + c + self._suffix_scored + self._suffix_rest for c in contents],
            truncation=True,
            max_length=self.max_length,
            add_special_tokens=False,
            return_offsets_mapping=True,
        )
        start = len(self._prefix)
        tokens, masks = [], []
        for content, ids, offsets in zip(contents, enc["input_ids"], enc["offset_mapping"]):
            end = start + len(content) + len(self._suffix_scored)
            masks.append([start <= a < end for a, _ in offsets])
            tokens.append(self.tokenizer.convert_ids_to_tokens(ids))
        try:
            results = self.generator.score_batch(tokens, max_batch_size=self.batch_size, max_input_length=0)
        except Exception as exc:
            raise BackendError(
                f"CTranslate2 failed to score {len(tokens)} turns ({type(exc).__name__}: {exc})"
            ) from exc
        losses = []
        for mask, result in zip(masks, results):
            scored = [
                -lp for lp, keep in zip(result.log_probs, mask[1:]) if keep
            ]  # log_probs[j] scores token j+1
            if not scored:
                raise ScoringError("a turn has no content tokens to score (empty after the chat template)")
            losses.append(sum(scored) / len(scored))
        return losses


@hookimpl
def optima_register_readability_scorers() -> list[ReadabilitySpec]:
    return [
        ReadabilitySpec(
            name="ct2",
            factory=CTranslate2LMLoss.from_pretrained,
            description="Frozen causal LM loss per turn (spec §3), via CTranslate2's score_batch.",
        )
    ]
