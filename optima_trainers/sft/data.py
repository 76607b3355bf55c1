"""SFT examples from selected episodes, with a loss mask on the viewing agent's own turns.

Each selected trajectory gives one example per agent (spec §5 item 5): that agent's BASE system
prompt (``episode.base_system_prompts``: the format instruction of iteration 0 is stripped, spec
§4) followed by every turn as a chat message. In the ``code`` message format every turn has role
``assistant`` (reference code); ``alternating`` gives the other agents' turns role ``user``.

The loss mask (spec §5 item 6) covers only the viewing agent's own turns, from after its
``"Name:"`` prefix (the prefix is forced at generation time) through the chat template's
end-of-message marker (``<|im_end|>``, ``<|eot_id|>``, ...). It is computed for ANY chat template
from character offsets, never from token ids:

1. render the conversation with ``apply_chat_template(tokenize=False)``, and render it again with
   every content replaced by a unique sentinel; the text between sentinels is the template's own
   text, so each content's span in the real rendering is known exactly;
2. the end-of-message marker is what the template writes after a lone assistant message (its
   trailing whitespace removed); it must start the template text that follows each message;
3. tokenize the rendering with ``return_offsets_mapping`` and keep the tokens whose first
   character falls in a trained span.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from optima_env.errors import TaskContractError
from optima_env.types import Episode

__all__ = [
    "MaskedExample",
    "build_sft_examples",
    "conversation_messages",
    "end_of_message_marker",
    "tokenize_with_mask",
]

logger = logging.getLogger(__name__)

_SENTINEL = "\u2063OPTIMA{}\u2063"


@dataclass(frozen=True, slots=True, kw_only=True)
class MaskedExample:
    """One tokenized training example: ``assistant_masks[t] == 1`` where token ``t`` is trained."""

    input_ids: tuple[int, ...]
    assistant_masks: tuple[int, ...]
    sample_id: str
    agent: str

    @property
    def num_trained(self) -> int:
        """How many tokens carry loss."""
        return sum(self.assistant_masks)


def conversation_messages(
    episode: Episode, agent: str, *, message_format: Literal["code", "alternating"] = "code"
) -> tuple[list[dict[str, str]], list[int]]:
    """``agent``'s view of ``episode`` as chat messages, and the indices of its own turns.

    The system message is the agent's base prompt (no format instruction).
    """
    if agent not in episode.base_system_prompts:
        raise TaskContractError(
            f"episode {episode.sample_id} has no base system prompt for {agent!r}; "
            f"agents with prompts: {sorted(episode.base_system_prompts)}"
        )
    if message_format not in ("code", "alternating"):
        raise TaskContractError(f"message_format must be 'code' or 'alternating', got {message_format!r}")
    messages = [{"role": "system", "content": episode.base_system_prompts[agent]}]
    own: list[int] = []
    for turn in episode.turns:
        mine = turn.agent == agent
        role = "assistant" if message_format == "code" or mine else "user"
        if mine:
            own.append(len(messages))
        messages.append({"role": role, "content": turn.text})
    return messages, own


def end_of_message_marker(tokenizer: Any) -> str:
    """The text the chat template writes right after an assistant message's content.

    >>> class T:  # a ChatML-like template
    ...     def apply_chat_template(self, messages, tokenize=False):
    ...         return "".join(f"<s>{m['role']}\\n{m['content']}</s>\\n" for m in messages)
    >>> end_of_message_marker(T())
    '</s>'
    """
    sentinel = _SENTINEL.format("end")
    rendered = _render(tokenizer, [{"role": "assistant", "content": sentinel}])
    if rendered.count(sentinel) != 1:
        raise TaskContractError(
            "the chat template does not render an assistant message's content verbatim, so the loss "
            "mask cannot be located; use a template that writes message['content'] as is"
        )
    return rendered.split(sentinel)[1].rstrip()


def _render(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    try:
        text = tokenizer.apply_chat_template(list(messages), tokenize=False)
    except Exception as exc:  # jinja / tokenizer errors come in many types
        raise TaskContractError(
            f"the tokenizer could not apply its chat template ({exc}); set tokenizer.chat_template"
        ) from exc
    if not isinstance(text, str):
        raise TaskContractError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
    return text


def _content_spans(
    tokenizer: Any, messages: Sequence[Mapping[str, str]]
) -> tuple[str, list[tuple[int, int]], list[str]]:
    """The rendering, each content's (start, end) in it, and the template text after each content."""
    rendered = _render(tokenizer, messages)
    sentinels = [_SENTINEL.format(i) for i in range(len(messages))]
    skeleton = _render(tokenizer, [{**m, "content": s} for m, s in zip(messages, sentinels)])
    pieces: list[str] = []
    rest = skeleton
    for s in sentinels:
        if rest.count(s) != 1:
            raise TaskContractError(
                "the chat template does not write every message's content exactly once, so the loss "
                "mask cannot be located from character offsets; use a standard chat template"
            )
        head, rest = rest.split(s)
        pieces.append(head)
    pieces.append(rest)
    spans: list[tuple[int, int]] = []
    pos = 0
    for i, message in enumerate(messages):
        if not rendered.startswith(pieces[i], pos):
            raise TaskContractError(
                f"the chat template renders message {i} differently with its real content; "
                "the loss mask cannot be located"
            )
        pos += len(pieces[i])
        content = message["content"]
        for candidate in (content, content.strip(), content.rstrip(), content.lstrip()):
            if rendered.startswith(candidate, pos) and rendered.startswith(
                pieces[i + 1], pos + len(candidate)
            ):
                break
        else:
            raise TaskContractError(
                f"message {i}'s content is transformed by the chat template beyond whitespace "
                "trimming; the loss mask cannot be located"
            )
        spans.append((pos, pos + len(candidate)))
        pos += len(candidate)
    return rendered, spans, pieces[1:]


def tokenize_with_mask(
    tokenizer: Any,
    messages: Sequence[Mapping[str, str]],
    trained: Sequence[int],
    *,
    prefixes: Mapping[int, str] | None = None,
    max_length: int | None = None,
) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and a 0/1 mask over them.

    Args:
        tokenizer: a fast tokenizer with a chat template (offsets are required).
        messages: the chat messages.
        trained: indices of the messages whose content carries loss.
        prefixes: per trained message, a leading text excluded from the loss (``"Alice:"``).
        max_length: keep at most this many tokens (from the start).

    Returns:
        ``(input_ids, mask)`` of equal length.
    """
    prefixes = dict(prefixes or {})
    rendered, spans, after = _content_spans(tokenizer, messages)
    eom = end_of_message_marker(tokenizer)
    targets: list[tuple[int, int]] = []
    for i in trained:
        start, end = spans[i]
        prefix = prefixes.get(i, "")
        if prefix and rendered.startswith(prefix, start):
            start += len(prefix)
        if eom:
            if not after[i].startswith(eom):
                raise TaskContractError(
                    f"the chat template closes a lone assistant message with {eom!r} but message {i} "
                    f"of the conversation with {after[i][:40]!r}; the loss mask cannot be located"
                )
            end += len(eom)
        targets.append((start, end))
    try:
        enc = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as exc:
        raise TaskContractError(
            "loss masks need a fast tokenizer (return_offsets_mapping); load it with use_fast=True"
        ) from exc
    ids = list(enc["input_ids"])
    mask = [int(any(a <= s < b for a, b in targets)) for s, _ in enc["offset_mapping"]]
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return ids, mask


def build_sft_examples(
    episodes: Sequence[Episode],
    tokenizer: Any,
    *,
    message_format: Literal["code", "alternating"] = "code",
    max_length: int | None = None,
    seed: int = 42,
    max_turn_tokens: int | None = None,
) -> tuple[list[MaskedExample], dict[str, int]]:
    """One masked example per agent per episode, shuffled with ``seed`` (spec §5 item 5).

    With ``max_turn_tokens`` (the generation cap; ``sft.train_capped_turns=False``), an own turn
    of at least that many tokens is context, not a target: the cap cut it.

    Returns:
        ``(examples, counts)``; ``counts`` says how many examples were built, how many own turns
        were left untrained as capped, and how many views were left out because the agent had no
        (uncapped) turn or truncation removed all of its tokens (nothing is dropped silently: the
        counts go to the metrics and the log).
    """
    examples: list[MaskedExample] = []
    counts = {"examples": 0, "skipped_no_turn": 0, "skipped_truncated": 0, "capped_turns": 0}
    for episode in episodes:
        for agent in episode.agents:
            messages, own = conversation_messages(episode, agent, message_format=message_format)
            if max_turn_tokens is not None:  # message i is turn i - 1 (the system message first)
                kept = [i for i in own if episode.turns[i - 1].num_tokens < max_turn_tokens]
                counts["capped_turns"] += len(own) - len(kept)
                own = kept
            if not own:
                counts["skipped_no_turn"] += 1
                continue
            ids, mask = tokenize_with_mask(
                tokenizer, messages, own, prefixes={i: f"{agent}:" for i in own}, max_length=max_length
            )
            if not any(mask):
                counts["skipped_truncated"] += 1
                continue
            examples.append(
                MaskedExample(
                    input_ids=tuple(ids),
                    assistant_masks=tuple(mask),
                    sample_id=episode.sample_id,
                    agent=agent,
                )
            )
    counts["examples"] = len(examples)
    skipped = counts["skipped_no_turn"] + counts["skipped_truncated"]
    if skipped:
        logger.warning(
            "left out %d of %d agent views (%d: the agent never spoke, or only in turns the "
            "generation cap cut; %d: nothing trained after truncation to max_length=%s)",
            skipped,
            skipped + len(examples),
            counts["skipped_no_turn"],
            counts["skipped_truncated"],
            max_length,
        )
    random.Random(seed).shuffle(examples)
    return examples, counts
