"""The contract every generation backend keeps, checked the same way for each of them."""

from __future__ import annotations

from optima_env.policy import ChatPolicy, GenerationRequest, SamplingParams

FACTS = ("Lojal Garbru works for Ryndal Systems.", "Ryndal Systems is headquartered in Ivofen.")


def chat_requests(n: int) -> list[GenerationRequest]:
    """``n`` different two-agent conversation states, alternating speakers (Alice, Bob, ...)."""
    requests = []
    for i in range(n):
        agent = ("Alice", "Bob")[i % 2]
        messages = [
            {
                "role": "system",
                "content": f"You are {agent}. Work with your partner to answer: where is the company "
                f"that Lojal Garbru works for headquartered? Your fact: {FACTS[i % 2]} "
                f'Begin your response with "{agent}:".',
            }
        ]
        for t in range(i // 2):
            speaker = ("Alice", "Bob")[t % 2]
            messages.append({"role": "assistant", "content": f"{speaker}: {FACTS[t % 2]}"})
        requests.append(
            GenerationRequest(messages=messages, prefix=f"{agent}:", agent=agent, key=(i, i // 2))
        )
    return requests


def check_contract(
    policy: ChatPolicy, requests: list[GenerationRequest], *, max_new_tokens: int, check_order: bool = True
) -> list[str]:
    """One str per request, each starting with its prefix; greedy is deterministic; order is kept."""
    assert isinstance(policy, ChatPolicy)
    greedy = SamplingParams(temperature=0, max_new_tokens=max_new_tokens)
    replies = policy.generate(requests, greedy)
    assert isinstance(replies, list) and len(replies) == len(requests)
    for request, reply in zip(requests, replies):
        assert isinstance(reply, str) and reply.startswith(request.prefix), (request.prefix, reply)
    assert len({r[len(q.prefix) :] for q, r in zip(requests, replies)}) > 1, "replies ignore their prompts"
    assert policy.generate(requests, greedy) == replies
    if check_order:
        assert policy.generate(requests[::-1], greedy) == replies[::-1]
    assert policy.generate([], greedy) == []
    return replies
