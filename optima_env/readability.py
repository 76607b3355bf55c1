"""The readability term's scorer: a frozen base model's LM loss on each turn alone (spec §3).

Each turn is formatted as a single chat message of role ``assistant`` with the tokenizer's chat
template, no history and no system prompt, as the reference code does (spec §3). A template that
injects a default system prompt when none is given (SmolLM2's does) has that block removed
(``system="none"``, default); ``system="template"`` keeps what the template renders. The loss is the
mean cross-entropy over the message's content tokens and its end-of-turn marker; the episode's
``lm_loss`` is the max over its turns. Scorers are plain callables ``texts -> losses``, so any
causal LM (or a remote service) can serve; this module ships the transformers one and registers
it as ``transformers`` through the ``optima_register_readability_scorers`` hook;
:mod:`optima_env.backends.ct2_readability` scores the same tokens through CTranslate2 (``ct2``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optima_env.errors import BackendError, ScoringError, require
from optima_env.hookspecs import hookimpl
from optima_env.specs import ReadabilitySpec

__all__ = [
    "SYSTEM_MODES",
    "TransformersLMLoss",
    "episode_lm_losses",
    "optima_register_readability_scorers",
    "turn_template",
]

_SENTINEL = "\u2063OPTIMA_CONTENT\u2063"
_OTHER = "\u2063OPTIMA_OTHER\u2063"
SYSTEM_MODES = ("none", "template")


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False)


def _without_default_system(tokenizer: Any, prefix: str, suffix: str) -> str:
    """``prefix`` minus the system block the template injected, if it injected one.

    The template's own pieces tell the block apart: a system message renders as
    ``open + content + close`` before the assistant header, and a second assistant message shows
    the header alone. When ``prefix`` is ``lead + open + default + close + header`` it becomes
    ``lead + header``; a template that injects nothing is left as it renders.
    """
    try:
        with_system = _render(
            tokenizer, [{"role": "system", "content": _OTHER}, {"role": "assistant", "content": _SENTINEL}]
        )
        two = _render(
            tokenizer, [{"role": "assistant", "content": _OTHER}, {"role": "assistant", "content": _SENTINEL}]
        )
    except Exception:  # a template that refuses these shapes: keep what it renders
        return prefix
    if with_system.count(_OTHER) != 1 or two.count(_OTHER) != 1:
        return prefix
    opener, rest = with_system.split(_SENTINEL)[0].split(_OTHER)
    between = two.split(_OTHER)[1].split(_SENTINEL)[0]
    if not between.startswith(suffix):
        return prefix
    header = between[len(suffix) :]
    if not (header and rest.endswith(header) and prefix.endswith(header)):
        return prefix
    closer, body = rest[: -len(header)], prefix[: -len(header)]
    at = body.find(opener)
    if at < 0 or not body.endswith(closer) or len(body) < at + len(opener) + len(closer):
        return prefix
    return body[:at] + header


def turn_template(tokenizer: Any, *, system: str = "none") -> tuple[str, str, str]:
    """How a lone turn is scored: ``(prefix, scored suffix, unscored suffix)`` around its content.

    The chat template renders ``prefix + content + suffix``; the loss covers the content and the
    scored suffix (the end-of-turn marker, trailing whitespace left out). Shared by every scorer
    so that they score the same tokens. ``system="none"`` (default, the reference: no system
    prompt) drops a default system block the template injects into a lone message;
    ``"template"`` keeps it.
    """
    if system not in SYSTEM_MODES:
        raise ScoringError(f"system must be one of {SYSTEM_MODES}, got {system!r}")
    rendered = _render(tokenizer, [{"role": "assistant", "content": _SENTINEL}])
    if rendered.count(_SENTINEL) != 1:
        raise BackendError("the chat template does not render an assistant message's content verbatim")
    prefix, suffix = rendered.split(_SENTINEL)
    if system == "none":
        prefix = _without_default_system(tokenizer, prefix, suffix)
    scored = suffix.rstrip()
    return prefix, scored, suffix[len(scored) :]


class TransformersLMLoss:
    """Per-turn mean LM loss under a frozen causal LM, computed in batches.

    Args:
        model: a transformers causal LM (kept in eval mode; never trained here).
        tokenizer: its (fast) tokenizer with a chat template.
        batch_size: turns per forward pass.
        max_length: longest scored sequence in tokens (longer turns are truncated on the right).
        system: ``"none"`` (the reference: no system prompt, a template's injected default
            removed) or ``"template"`` (what the template renders for a lone message).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int = 16,
        max_length: int = 2048,
        system: str = "none",
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.system = system
        self._prefix, self._suffix_scored, self._suffix_rest = turn_template(tokenizer, system=system)

    @classmethod
    def from_pretrained(cls, name_or_path: str = "embedded", **kwargs: Any) -> TransformersLMLoss:
        """Load the frozen base model with :func:`optima_env.models.load_model`."""
        from optima_env.models import load_model

        load_kwargs = {k: kwargs.pop(k) for k in ("dtype", "device") if k in kwargs}
        model, tokenizer = load_model(name_or_path, **load_kwargs)
        return cls(model, tokenizer, **kwargs)

    def __call__(self, texts: Sequence[str]) -> list[float]:
        """The mean content-token loss of each text (same order)."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        losses: list[float] = [0.0] * len(texts)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            for i, loss in zip(chunk, self._batch([texts[i] for i in chunk])):
                losses[i] = loss
        return losses

    def _batch(self, texts: list[str]) -> list[float]:
        torch = require("torch", "train")
        contents = [t.strip() for t in texts]
        full = [self._prefix + c + self._suffix_scored + self._suffix_rest for c in contents]
        padding_side = self.tokenizer.padding_side
        self.tokenizer.padding_side = "right"
        try:
            enc = self.tokenizer(
                full,
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
                add_special_tokens=False,
                return_offsets_mapping=True,
            )
        finally:
            self.tokenizer.padding_side = padding_side
        offsets = enc.pop("offset_mapping")
        start = len(self._prefix)
        ends = torch.tensor([start + len(c) + len(self._suffix_scored) for c in contents]).unsqueeze(1)
        mask = (offsets[..., 0] >= start) & (offsets[..., 0] < ends) & enc["attention_mask"].bool()
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        with torch.inference_mode():
            logits = self.model(**enc).logits.float()
        target_mask = mask[:, 1:].to(logits.device)
        log_probs = torch.nn.functional.cross_entropy(
            logits[:, :-1].transpose(1, 2), enc["input_ids"][:, 1:], reduction="none"
        )
        counts = target_mask.sum(dim=1)
        if bool((counts == 0).any()):
            raise ScoringError("a turn has no content tokens to score (empty after the chat template)")
        per_text = (log_probs * target_mask).sum(dim=1) / counts
        return [float(x) for x in per_text.cpu()]


def score_turns(scorer: Any, texts: Sequence[str]) -> list[float]:
    """The scorer's per-turn losses of ``texts`` (one each, checked; no call for no text)."""
    losses = [float(x) for x in scorer(list(texts))] if texts else []
    if len(losses) != len(texts):
        raise ScoringError(f"the readability scorer returned {len(losses)} losses for {len(texts)} turns")
    return losses


def max_turn_loss(losses: Sequence[float]) -> float | None:
    """R_loss of an episode (spec §3): the max of its per-turn losses; ``None`` when it has no turn.

    >>> max_turn_loss([1.5, 2.25, 0.5]), max_turn_loss([])
    (2.25, None)
    """
    return float(max(losses)) if len(losses) else None


def episode_lm_losses(scorer: Any, turn_texts: Sequence[Sequence[str]]) -> list[float | None]:
    """Max per-turn loss for each episode, scoring every turn of every episode in one call."""
    losses = score_turns(scorer, [t for turns in turn_texts for t in turns])
    out: list[float | None] = []
    pos = 0
    for turns in turn_texts:
        out.append(max_turn_loss(losses[pos : pos + len(turns)]))
        pos += len(turns)
    return out


@hookimpl
def optima_register_readability_scorers() -> list[ReadabilitySpec]:
    return [
        ReadabilitySpec(
            name="transformers",
            factory=TransformersLMLoss.from_pretrained,
            description="Frozen causal LM loss per turn (spec §3), via transformers.",
        )
    ]
