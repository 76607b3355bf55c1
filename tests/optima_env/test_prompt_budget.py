"""``max_prompt_tokens``: a conversation whose next prompt would not fit the model ends
flagged like the turn cap (``context_full``, truncated); a first prompt that cannot fit is a clear
error naming the instance. On the transformers engine with the embedded tokenizer."""

from __future__ import annotations

import pytest

from optima_env import ConversationEnv, make_task
from optima_env.errors import TaskContractError
from optima_env.policy import SamplingParams, ScriptedPolicy
from optima_env.rollout import make_jobs, rollout


@pytest.fixture(scope="module")
def tokenizer():
    transformers = pytest.importorskip("transformers")
    from optima_env.models import resolve_model_path

    return transformers.AutoTokenizer.from_pretrained(resolve_model_path("embedded"))


def prompt_tokens(env: ConversationEnv, agent: str, tokenizer) -> int:
    ids = tokenizer.apply_chat_template(env.chat_messages(agent), add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def test_the_conversation_ends_when_the_next_prompt_would_not_fit(tokenizer) -> None:
    task = make_task("ie/synth-v0")
    long_turn = "word " * 25
    probe = ConversationEnv(task, tokenizer=tokenizer, max_turns=10)
    probe.reset(seed=0, options={"index": 0})
    probe.step(long_turn)
    bob_next = prompt_tokens(probe, "Bob", tokenizer)  # what Bob reads after Alice's turn
    probe.step(long_turn)
    alice_next = prompt_tokens(probe, "Alice", tokenizer)  # what Alice reads after both turns
    assert alice_next > bob_next
    budget = max(bob_next, alice_next - 1)  # Bob's fits; Alice's next one does not
    env = ConversationEnv(task, tokenizer=tokenizer, max_prompt_tokens=budget, max_turns=10)
    env.reset(seed=0, options={"index": 0})
    env.step(long_turn)  # Bob's prompt now holds Alice's turn: still within the budget
    assert env.episode is None
    env.step(long_turn)
    episode = env.episode
    assert episode is not None and episode.end_reason == "context_full" and episode.truncated
    assert len(episode.turns) == 2
    with pytest.raises(TaskContractError, match=r"instance 'synth-0-train-0' \(split 'train'\), turn 0: Alice's first prompt"):
        ConversationEnv(task, tokenizer=tokenizer, max_prompt_tokens=10).reset(seed=0, options={"index": 0})


def test_a_budget_needs_a_chat_tokenizer() -> None:
    with pytest.raises(TaskContractError, match="max_prompt_tokens needs the policy's tokenizer"):
        ConversationEnv(make_task("ie/synth-v0"), max_prompt_tokens=100)


def test_on_the_transformers_engine_a_long_conversation_ends_flagged_not_failed(tokenizer, tmp_path) -> None:
    pytest.importorskip("torch")
    from optima_env.backends.loading import load_policy
    from tests.tiny_model import make_tiny_model

    policy = load_policy(str(make_tiny_model(tmp_path / "tiny")), backend="hf", batch_size=2, dtype="float32")
    episodes = rollout(
        make_task("ie/synth-v0"),
        policy,
        jobs=make_jobs(range(2), 1, seed=0),
        sampling=SamplingParams(temperature=0.7, max_new_tokens=40, seed=0, ignore_eos=True),
        env_kwargs={"tokenizer": policy.tokenizer, "max_turns": 10, "max_prompt_tokens": 400},
        concurrency=2,
    )
    assert [e.end_reason for e in episodes] == ["context_full"] * 2
    assert all(e.truncated and 0 < len(e.turns) < 10 for e in episodes)


def test_scripted_rollouts_keep_their_results_in_job_order_with_a_budget(tokenizer) -> None:
    replies = ScriptedPolicy(lambda request: "<A>x</A>")
    episodes = rollout(make_task("ie/synth-v0"), replies, jobs=make_jobs(range(3), 1, seed=1),
                       env_kwargs={"tokenizer": tokenizer, "max_prompt_tokens": 4000})  # fmt: skip
    assert [e.end_reason for e in episodes] == ["agreement"] * 3
