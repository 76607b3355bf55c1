"""Loss masks of SFT examples, token by token, on two chat templates (ChatML and Llama-3 style)."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from optima_env.errors import TaskContractError
from optima_env.types import Episode, Turn
from optima_trainers.sft.data import (
    build_sft_examples,
    conversation_messages,
    end_of_message_marker,
    tokenize_with_mask,
)

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

MESSAGES = [
    {"role": "system", "content": "You are Alice.\n"},
    {"role": "assistant", "content": "Alice: hi there"},
    {"role": "assistant", "content": "Bob: <A>x</A>"},
    {"role": "assistant", "content": "Alice: ok"},
]


@pytest.fixture(scope="module")
def chatml():
    """SmolLM2's own tokenizer and ChatML template (the embedded model)."""
    transformers = pytest.importorskip("transformers")
    from optima_env.models import ensure_embedded_model

    return transformers.AutoTokenizer.from_pretrained(ensure_embedded_model())


@pytest.fixture(scope="module")
def llama3(chatml):
    """A copy of the embedded tokenizer with a Llama-3 chat template and its special tokens."""
    tok = copy.deepcopy(chatml)
    tok.add_special_tokens(
        {
            "bos_token": "<|begin_of_text|>",
            "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        }
    )
    tok.chat_template = LLAMA3_TEMPLATE
    return tok


def pairs(tokenizer, trained):
    ids, mask = tokenize_with_mask(
        tokenizer,
        MESSAGES,
        trained,
        prefixes={i: MESSAGES[i]["content"].split(":")[0] + ":" for i in trained},
    )
    return list(zip(tokenizer.convert_ids_to_tokens(ids), mask))


CHATML_HEAD = [("<|im_start|>", 0), ("system", 0), ("Ċ", 0), ("You", 0), ("Ġare", 0), ("ĠAlice", 0),
               (".", 0), ("Ċ", 0), ("<|im_end|>", 0), ("Ċ", 0)]  # fmt: skip
CHATML_ASSISTANT = [("<|im_start|>", 0), ("ass", 0), ("istant", 0), ("Ċ", 0)]
LLAMA_HEAD = [("<|begin_of_text|>", 0), ("<|start_header_id|>", 0), ("system", 0),
              ("<|end_header_id|>", 0), ("Ċ", 0), ("Ċ", 0), ("You", 0), ("Ġare", 0), ("ĠAlice", 0),
              (".", 0), ("<|eot_id|>", 0)]  # fmt: skip
LLAMA_ASSISTANT = [
    ("<|start_header_id|>", 0),
    ("ass", 0),
    ("istant", 0),
    ("<|end_header_id|>", 0),
    ("Ċ", 0),
    ("Ċ", 0),
]


def test_chatml_mask_alice_trains_own_turns_after_prefix_through_im_end(chatml) -> None:
    expected = (
        CHATML_HEAD
        + CHATML_ASSISTANT
        + [("Alice", 0), (":", 0), ("Ġhi", 1), ("Ġthere", 1), ("<|im_end|>", 1), ("Ċ", 0)]
        + CHATML_ASSISTANT
        + [("Bob", 0), (":", 0), ("Ġ<", 0), ("A", 0), (">", 0), ("x", 0), ("</", 0), ("A", 0), (">", 0)]
        + [("<|im_end|>", 0), ("Ċ", 0)]
        + CHATML_ASSISTANT
        + [("Alice", 0), (":", 0), ("Ġok", 1), ("<|im_end|>", 1), ("Ċ", 0)]
    )
    assert pairs(chatml, [1, 3]) == expected


def test_chatml_mask_bob(chatml) -> None:
    expected = (
        CHATML_HEAD
        + CHATML_ASSISTANT
        + [("Alice", 0), (":", 0), ("Ġhi", 0), ("Ġthere", 0), ("<|im_end|>", 0), ("Ċ", 0)]
        + CHATML_ASSISTANT
        + [("Bob", 0), (":", 0), ("Ġ<", 1), ("A", 1), (">", 1), ("x", 1), ("</", 1), ("A", 1), (">", 1)]
        + [("<|im_end|>", 1), ("Ċ", 0)]
        + CHATML_ASSISTANT
        + [("Alice", 0), (":", 0), ("Ġok", 0), ("<|im_end|>", 0), ("Ċ", 0)]
    )
    assert pairs(chatml, [2]) == expected


def test_llama3_mask_alice_with_trimmed_content_and_eot(llama3) -> None:
    expected = (
        LLAMA_HEAD
        + LLAMA_ASSISTANT
        + [("Alice", 0), (":", 0), ("Ġhi", 1), ("Ġthere", 1), ("<|eot_id|>", 1)]
        + LLAMA_ASSISTANT
        + [("Bob", 0), (":", 0), ("Ġ<", 0), ("A", 0), (">", 0), ("x", 0), ("</", 0), ("A", 0), (">", 0)]
        + [("<|eot_id|>", 0)]
        + LLAMA_ASSISTANT
        + [("Alice", 0), (":", 0), ("Ġok", 1), ("<|eot_id|>", 1)]
    )
    assert pairs(llama3, [1, 3]) == expected


def test_llama3_mask_bob(llama3) -> None:
    expected = (
        LLAMA_HEAD
        + LLAMA_ASSISTANT
        + [("Alice", 0), (":", 0), ("Ġhi", 0), ("Ġthere", 0), ("<|eot_id|>", 0)]
        + LLAMA_ASSISTANT
        + [("Bob", 0), (":", 0), ("Ġ<", 1), ("A", 1), (">", 1), ("x", 1), ("</", 1), ("A", 1), (">", 1)]
        + [("<|eot_id|>", 1)]
        + LLAMA_ASSISTANT
        + [("Alice", 0), (":", 0), ("Ġok", 0), ("<|eot_id|>", 0)]
    )
    assert pairs(llama3, [2]) == expected


def test_end_of_message_markers(chatml, llama3) -> None:
    assert end_of_message_marker(chatml) == "<|im_end|>"
    assert end_of_message_marker(llama3) == "<|eot_id|>"


def test_template_that_rewrites_content_is_rejected(chatml) -> None:
    tok = copy.deepcopy(chatml)
    tok.chat_template = "{% for m in messages %}{{ m['content'] | upper }}\n{% endfor %}"
    with pytest.raises(TaskContractError, match="loss mask"):
        tokenize_with_mask(tok, MESSAGES, [1])


def _episode() -> Episode:
    texts = [
        ("Alice", "Alice: I know A."),
        ("Bob", "Bob: I know B. <A>Rome</A>"),
        ("Alice", "Alice: <A>Rome</A>"),
    ]
    turns = tuple(Turn(index=i, agent=a, text=t, num_tokens=5) for i, (a, t) in enumerate(texts))
    return Episode(
        task_id="t/x-v0",
        sample_id="s0",
        seed=1,
        agents=("Alice", "Bob"),
        turns=turns,
        final_answer="Rome",
        gold=("Rome",),
        task_score=1.0,
        terminated=True,
        truncated=False,
        end_reason="agreement",
        num_tokens=15,
        system_prompts={
            "Alice": "You are Alice. FORMAT: use a table.",
            "Bob": "You are Bob. FORMAT: use a table.",
        },
        base_system_prompts={"Alice": "You are Alice.", "Bob": "You are Bob."},
        format_index=1,
    )


def test_conversation_uses_base_prompt_and_roles() -> None:
    episode = _episode()
    messages, own = conversation_messages(episode, "Bob")
    assert messages[0] == {"role": "system", "content": "You are Bob."}
    assert [m["role"] for m in messages[1:]] == ["assistant"] * 3
    assert own == [2]
    alternating, _ = conversation_messages(episode, "Bob", message_format="alternating")
    assert [m["role"] for m in alternating[1:]] == ["user", "assistant", "user"]


def test_build_sft_examples_one_per_agent_with_own_turns_only(chatml) -> None:
    examples, counts = build_sft_examples([_episode()], chatml)
    assert counts == {"examples": 2, "skipped_no_turn": 0, "skipped_truncated": 0, "capped_turns": 0}
    by_agent = {e.agent: e for e in examples}
    trained = {
        a: chatml.decode([t for t, m in zip(e.input_ids, e.assistant_masks) if m])
        for a, e in by_agent.items()
    }
    assert trained["Alice"] == " I know A.<|im_end|> <A>Rome</A><|im_end|>"
    assert trained["Bob"] == " I know B. <A>Rome</A><|im_end|>"
    text = chatml.decode(by_agent["Alice"].input_ids)
    assert "FORMAT" not in text and "You are Alice." in text


def test_truncation_that_removes_every_trained_token_is_counted(chatml) -> None:
    examples, counts = build_sft_examples([_episode()], chatml, max_length=12)
    assert examples == []
    assert counts["skipped_truncated"] == 2


def test_a_turn_the_generation_cap_cut_is_context_not_a_target(chatml) -> None:
    """``sft.train_capped_turns=False``: a turn of at least ``max_turn_tokens`` tokens stays in the
    conversation (the partner answered it) but is not trained, so no cut turn teaches a stop."""
    episode = _episode()
    capped = Turn(index=0, agent="Alice", text="Alice: I know A and more and more", num_tokens=8)
    episode = dataclasses.replace(episode, turns=(capped, *episode.turns[1:]))
    examples, counts = build_sft_examples([episode], chatml, max_turn_tokens=8)
    assert counts["capped_turns"] == 1 and counts["examples"] == 2
    alice = next(e for e in examples if e.agent == "Alice")
    trained = chatml.decode([t for t, m in zip(alice.input_ids, alice.assistant_masks) if m])
    assert trained == " <A>Rome</A><|im_end|>"  # only the turn that ended by itself
    assert "I know A and more" in chatml.decode(alice.input_ids)  # still the context of Bob's reply
    everything, counted = build_sft_examples([episode], chatml, max_turn_tokens=9)
    assert counted["capped_turns"] == 0 and len(everything) == 2
    # an agent whose every turn was cut has nothing to learn from this conversation
    only_capped, counts = build_sft_examples([episode], chatml, max_turn_tokens=5)
    assert counts["capped_turns"] == 3 and only_capped == [] and counts["skipped_no_turn"] == 2
