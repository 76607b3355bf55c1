"""The readability term's scorer: a frozen base model's LM loss on each turn alone (spec §3).

Each turn is formatted as a single chat message of role ``assistant`` with the tokenizer's chat
template, no history and no system prompt, as the reference code does (spec §3). A template that
injects a default system prompt when none is given (SmolLM2's does) has that block removed
(``system="none"``, default); ``system="template"`` keeps what the template renders. The loss is the
mean cross-entropy over the message's content tokens and its end-of-turn marker; the episode's
``lm_loss`` is the max over its turns. Scorers are plain callables ``texts -> losses``, so any
causal LM (or a remote service) can serve; this module ships the transformers one and registers
it as ``transformers`` through the ``optima_register_readability_scorers`` hook.
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
    "budget_batches",
    "encode_turns",
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


def budget_batches(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Consecutive groups of ``lengths`` (sorted ascending) whose padded size fits the budget.

    A group's padded size is its count times its longest length; a group grows while the next item
    keeps it within ``max_batch_tokens``. An item longer than the budget forms a group alone (a turn
    is never split: it is scored whole or not at all).

    >>> budget_batches([3, 4, 4, 9, 20], 12)
    [[0, 1, 2], [3], [4]]
    """
    groups: list[list[int]] = []
    for i, length in enumerate(lengths):
        if groups and (len(groups[-1]) + 1) * length <= max_batch_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def encode_turns(
    tokenizer: Any, texts: Sequence[str], template: tuple[str, str, str], *, max_length: int
) -> list[tuple[list[int], list[int]]]:
    """Each turn's token ids and the positions of its scored tokens (its content and the scored
    suffix of ``template``, :func:`turn_template`), truncated on the right at ``max_length``
    tokens: the tokens every scorer scores (:class:`TransformersLMLoss`, the vLLM engine's own
    :class:`~optima_env.backends.vllm_lora.EngineLMLoss`)."""
    prefix, suffix_scored, suffix_rest = template
    contents = [t.strip() for t in texts]
    enc = tokenizer(
        [prefix + c + suffix_scored + suffix_rest for c in contents],
        truncation=True,
        max_length=max_length,
        add_special_tokens=False,
        return_offsets_mapping=True,
    )
    start = len(prefix)
    out = []
    for n, (ids, offsets, content) in enumerate(zip(enc["input_ids"], enc["offset_mapping"], contents)):
        end = start + len(content) + len(suffix_scored)
        scored = [j for j, (lo, _) in enumerate(offsets) if j > 0 and start <= lo < end]
        if not scored:
            raise ScoringError(
                f"turn {n} has no content tokens to score (empty after the chat template, or "
                f"max_length={max_length} too short for its template prefix): raise max_length"
            )
        out.append((list(ids), scored))
    return out


class TransformersLMLoss:
    """Per-turn mean LM loss under a frozen causal LM, in batches of at most ``max_batch_tokens``.

    The turns are tokenized once, sorted by token count and packed into batches whose padded size
    (turns x longest turn) stays within ``max_batch_tokens``. The model's weights keep their dtype
    (bf16 stays bf16). No full-vocabulary logits tensor is built: the decoder's final hidden states
    of the positions that predict a content token are gathered, and the LM head is applied to at
    most ``chunk_tokens`` of them at a time, each chunk's logits upcast to fp32 for the
    cross-entropy and dropped before the next; the reduction (sum over a turn's tokens, mean) is
    fp32. transformers offers ``logits_to_keep`` (one set of positions for every row, all logits
    of those positions at once, and a new decoder pass per call) and its loss function upcasts every
    kept logit to fp32, so neither bounds the logits' size; hence this loop. A model whose head does
    more than its output embedding (a final logit soft-cap, a logit scale: checked once against the
    model's own forward) is scored through ``logits_to_keep`` instead, content positions only, each
    chunk upcast in turn.

    Args:
        model: a transformers causal LM (kept in eval mode; never trained here).
        tokenizer: its (fast) tokenizer with a chat template.
        max_batch_tokens: padded tokens per forward pass (default 2048: about today's 16 turns on
            the CPU); a turn longer than this is scored alone.
        max_length: longest scored sequence in tokens (longer turns are truncated on the right).
        system: ``"none"`` (the reference: no system prompt, a template's injected default
            removed) or ``"template"`` (what the template renders for a lone message).
        chunk_tokens: positions per LM-head chunk; default ``2**26 // vocabulary`` (256 MB of fp32
            logits: 512 positions for Llama 3's 128k vocabulary).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_tokens: int = 2048,
        max_length: int = 2048,
        system: str = "none",
        chunk_tokens: int | None = None,
    ) -> None:
        for name, value in (("max_batch_tokens", max_batch_tokens), ("max_length", max_length)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ScoringError(f"{name} must be an int >= 1 (tokens), got {value!r}")
        if chunk_tokens is not None and (not isinstance(chunk_tokens, int) or chunk_tokens < 1):
            raise ScoringError(
                f"chunk_tokens must be an int >= 1 or None (from the vocabulary), got {chunk_tokens!r}"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_tokens = max_batch_tokens
        self.max_length = max_length
        self.system = system
        head = model.get_output_embeddings()
        vocab = head.weight.shape[0] if head is not None else model.config.get_text_config().vocab_size
        self.chunk_tokens = chunk_tokens or max(1, 2**26 // vocab)
        self._prefix, self._suffix_scored, self._suffix_rest = turn_template(tokenizer, system=system)
        self._plain_head: bool | None = None  # checked on the first call

    @classmethod
    def from_pretrained(cls, name_or_path: str = "embedded", **kwargs: Any) -> TransformersLMLoss:
        """Load the frozen base model with :func:`optima_env.models.load_model`."""
        from optima_env.models import load_model

        load_kwargs = {k: kwargs.pop(k) for k in ("dtype", "device") if k in kwargs}
        model, tokenizer = load_model(name_or_path, **load_kwargs)
        return cls(model, tokenizer, **kwargs)

    def __call__(self, texts: Sequence[str]) -> list[float]:
        """The mean content-token loss of each text (same order)."""
        if not texts:
            return []
        turns = self._encode(texts)
        order = sorted(range(len(turns)), key=lambda i: len(turns[i][0]))
        losses: list[float] = [0.0] * len(texts)
        for group in budget_batches([len(turns[i][0]) for i in order], self.max_batch_tokens):
            chunk = [order[g] for g in group]
            for i, loss in zip(chunk, self._batch([turns[i] for i in chunk])):
                losses[i] = loss
        return losses

    def _encode(self, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """Each text's token ids and the positions of its scored tokens (content + end marker)."""
        template = (self._prefix, self._suffix_scored, self._suffix_rest)
        return encode_turns(self.tokenizer, texts, template, max_length=self.max_length)

    def _batch(self, turns: list[tuple[list[int], list[int]]]) -> list[float]:
        torch = require("torch", "train")
        device = self.model.device
        width = max(len(ids) for ids, _ in turns)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.full((len(turns), width), pad, dtype=torch.long)
        attention = torch.zeros((len(turns), width), dtype=torch.long)
        rows, cols = [], []
        for r, (ids, scored) in enumerate(turns):
            input_ids[r, : len(ids)] = torch.tensor(ids)
            attention[r, : len(ids)] = 1
            rows += [r] * len(scored)
            cols += [j - 1 for j in scored]  # position j - 1 predicts token j
        rows_t, cols_t = torch.tensor(rows), torch.tensor(cols)
        targets = input_ids[rows_t, cols_t + 1].to(device)
        input_ids, attention = input_ids.to(device), attention.to(device)
        with torch.inference_mode():
            if self._plain_head is None:
                self._plain_head = self._head_is_plain(input_ids[:1, : min(width, 16)])
            if self._plain_head:
                hidden = self.model.get_decoder()(
                    input_ids=input_ids, attention_mask=attention, use_cache=False
                )
                token_losses = self._chunked_loss(
                    hidden.last_hidden_state[rows_t.to(device), cols_t.to(device)], targets
                )
            else:
                token_losses = self._kept_logits_loss(input_ids, attention, rows_t, cols_t, targets)
            sums = torch.zeros(len(turns), dtype=torch.float32, device=device).index_add_(
                0, rows_t.to(device), token_losses
            )
        counts = torch.tensor([len(scored) for _, scored in turns], dtype=torch.float32)
        return [float(x) for x in sums.cpu() / counts]

    def _chunked_loss(self, hidden: Any, targets: Any) -> Any:
        """Per-position cross-entropy of ``hidden`` (``[n, width]``) against ``targets``, through
        the LM head ``chunk_tokens`` positions at a time, fp32 per chunk."""
        torch = require("torch", "train")
        head = self.model.get_output_embeddings()
        out = torch.empty(len(targets), dtype=torch.float32, device=targets.device)
        for s in range(0, len(targets), self.chunk_tokens):
            logits = head(hidden[s : s + self.chunk_tokens])
            out[s : s + self.chunk_tokens] = torch.nn.functional.cross_entropy(
                logits.float(), targets[s : s + self.chunk_tokens], reduction="none"
            )
            del logits
        return out

    def _kept_logits_loss(self, input_ids: Any, attention: Any, rows: Any, cols: Any, targets: Any) -> Any:
        """The fallback for a head that is more than the output embedding: the model's own logits
        of the predicting positions only (``logits_to_keep``), fp32 per chunk."""
        torch = require("torch", "train")
        keep = torch.unique(cols)
        logits = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            use_cache=False,
            logits_to_keep=keep.to(input_ids.device),
        ).logits
        at = torch.searchsorted(keep, cols).to(logits.device)
        rows = rows.to(logits.device)
        out = torch.empty(len(targets), dtype=torch.float32, device=targets.device)
        for s in range(0, len(targets), self.chunk_tokens):
            part = logits[rows[s : s + self.chunk_tokens], at[s : s + self.chunk_tokens]].float()
            out[s : s + self.chunk_tokens] = torch.nn.functional.cross_entropy(
                part, targets[s : s + self.chunk_tokens], reduction="none"
            )
        return out

    def _head_is_plain(self, input_ids: Any) -> bool:
        """Whether the model's logits are its output embedding applied to its decoder's output
        (false for a final soft-cap or a logit scale), on a few tokens."""
        torch = require("torch", "train")
        head, decoder = self.model.get_output_embeddings(), self.model.get_decoder()
        if head is None or decoder is self.model:  # no separate head to apply: the model's own logits
            return False
        full = self.model(input_ids=input_ids, use_cache=False).logits
        hidden = getattr(decoder(input_ids=input_ids, use_cache=False), "last_hidden_state", None)
        if hidden is None:
            return False
        ours = head(hidden)
        # the same modules on the same input: equal but for a head that does more (no fp32 copy made)
        return bool(torch.allclose(full, ours, rtol=1e-5, atol=1e-6))


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
