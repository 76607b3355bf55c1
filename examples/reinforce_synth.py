"""A minimal example, kept deliberately small: the optima env under a hand-written REINFORCE loop.

For real training use TRL's GRPOTrainer through ``optima_trainers.integrations.trl`` (README,
"Reuse the env with other RL methods"), or ``python -m optima_trainers.train --trainer grpo``.
This file shows the env's contract with no library in between.

Nothing Optima-specific is trained here: the PettingZoo env plays the conversation and pays the
episode reward (task score, token cost, readability when a scorer is given), and a textbook
REINFORCE update with a running-mean baseline pushes up the log-probability of every agent's own
turns in proportion to the advantage::

    loss = - (R - b) * mean over the agent's own turn tokens of log p(token | context)

Both agents share one model, as in Optima. The per-agent token masks come from
:func:`optima_trainers.sft.data.tokenize_with_mask` (offsets of the chat template, any template).

Example (a few minutes on 2 cores with the embedded SmolLM2-135M)::

    python examples/reinforce_synth.py --steps 4 --episodes 4 --max-turns 4 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import logging
import statistics
from typing import Any

import optima_env
from optima_env.backends.hf import TransformersPolicy
from optima_env.policy import GenerationRequest, SamplingParams
from optima_env.types import Episode
from optima_trainers.sft.data import conversation_messages, tokenize_with_mask

logger = logging.getLogger("reinforce_synth")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded", help="embedded, a Hugging Face name or a local folder")
    p.add_argument("--task", default="ie/synth-v0")
    p.add_argument("--steps", type=int, default=4, help="policy-gradient updates")
    p.add_argument("--episodes", type=int, default=4, help="episodes per update")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--baseline-decay", type=float, default=0.9, help="running-mean baseline decay")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def play(env: Any, policy: TransformersPolicy, *, seed: int, sampling: SamplingParams) -> Episode:
    """One episode through the PettingZoo AEC API; each turn is one chat request to the policy."""
    env.reset(seed=seed)
    for agent in env.agent_iter():
        _, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        request = GenerationRequest(
            messages=env.chat_messages(agent),
            prefix=env.reply_prefix(agent),
            agent=agent,
            key=(seed, len(env.turns)),
        )
        (reply,) = policy.generate([request], sampling)
        env.step(reply)
    return env.episode


def own_turn_log_prob(model: Any, tokenizer: Any, episode: Episode, agent: str) -> Any:
    """Mean log-probability of ``agent``'s own turn tokens (its prompt, the partner's turns masked)."""
    import torch

    messages, own = conversation_messages(episode, agent)
    # the episode as the agent played it: with the prompt it actually saw (format line included)
    messages[0] = {"role": "system", "content": episode.system_prompts[agent]}
    ids, mask = tokenize_with_mask(tokenizer, messages, own, prefixes={i: f"{agent}:" for i in own})
    input_ids = torch.tensor([ids], device=model.device)
    logits = model(input_ids=input_ids).logits[:, :-1].float()
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
    target = torch.tensor([mask[1:]], dtype=log_probs.dtype, device=model.device)
    return (log_probs * target).sum() / target.sum().clamp(min=1)


def train(args: argparse.Namespace) -> tuple[Any, list[dict[str, float]]]:
    """Run REINFORCE; returns the trained model and per-step metrics."""
    import torch

    torch.manual_seed(args.seed)
    policy = TransformersPolicy.from_pretrained(args.model, batch_size=1)
    model, tokenizer = policy.model, policy.tokenizer
    env = optima_env.make(args.task, max_turns=args.max_turns, tokenizer=tokenizer)
    sampling = SamplingParams(
        temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    baseline, history = 0.0, []
    for step in range(args.steps):
        model.eval()
        episodes = [
            play(env, policy, seed=args.seed * 100_003 + step * args.episodes + i, sampling=sampling)
            for i in range(args.episodes)
        ]
        rewards = [e.reward.total for e in episodes]
        model.train()
        optimizer.zero_grad()
        loss = torch.zeros((), device=model.device)
        for episode, reward in zip(episodes, rewards):
            advantage = reward - baseline
            for agent in episode.agents:
                if any(t.agent == agent for t in episode.turns):
                    loss = loss - advantage * own_turn_log_prob(model, tokenizer, episode, agent) / len(
                        episodes
                    )
        loss.backward()
        optimizer.step()
        baseline = args.baseline_decay * baseline + (1 - args.baseline_decay) * statistics.fmean(rewards)
        record = {
            "step": float(step),
            "reward/total": statistics.fmean(rewards),
            "rollout/task_score": statistics.fmean(e.task_score for e in episodes),
            "rollout/tokens": statistics.fmean(e.num_tokens for e in episodes),
            "train/loss": float(loss.detach()),
        }
        history.append(record)
        logger.info("step %d: %s", step, {k: round(v, 4) for k, v in record.items()})
    model.eval()
    return model, history


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
