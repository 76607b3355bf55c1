"""TRL's GRPOTrainer on an optima task: masks token by token, the rollout adapter, a real GRPO step,
the ``grpo`` backend from the CLI, and a different policy per agent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from optima_env import make_task
from optima_env.policy import GenerationRequest, PerAgentPolicy, SamplingParams, ScriptedPolicy
from optima_env.reward import RewardConfig
from optima_env.rollout import make_jobs, rollout
from optima_trainers.integrations.trl import (
    OptimaRollout,
    grpo_prompts,
    parse_prompt,
    reward_functions,
    sequences,
)
from tests.helpers import REPO_ROOT

ALICE, BOB = "Alice: I hold F1 <A>Qesh</A>", "Bob: agreed <A>Qesh</A>"


@pytest.fixture(scope="module")
def tokenizer():
    transformers = pytest.importorskip("transformers")
    from optima_env.models import ensure_embedded_model

    return transformers.AutoTokenizer.from_pretrained(ensure_embedded_model())


def _episode(turns=(ALICE, BOB)):
    task = make_task("ie/synth-v0")
    (episode,) = rollout(
        task, ScriptedPolicy.from_turns(list(turns)), jobs=make_jobs([0], 1, 0), sampling=SamplingParams()
    )
    return episode


def test_completion_masks_token_by_token_on_a_two_agent_conversation(tokenizer) -> None:
    episode = _episode()
    assert [t.agent for t in episode.turns] == ["Alice", "Bob"]
    for agent, own, other in (("Alice", ALICE, BOB), ("Bob", BOB, ALICE)):
        prompt, completion, mask = sequences(episode, agent, tokenizer)
        assert len(completion) == len(mask) and set(mask) == {0, 1}
        # the prompt is the agent's system message, nothing of the conversation
        text = tokenizer.decode(prompt)
        assert text.startswith("<|im_start|>system\n") and episode.base_system_prompts[agent] in text
        assert "Qesh" not in text.split(episode.base_system_prompts[agent])[-1]
        # trained tokens: exactly what the agent wrote (after its forced "Name:"), and its end of turn
        trained = [t for t, m in zip(completion, mask) if m]
        assert tokenizer.decode(trained) == own.split(":", 1)[1] + "<|im_end|>"
        # everything else in the completion: the template, the forced prefix, the other agent's turn
        untrained = tokenizer.decode([t for t, m in zip(completion, mask) if not m])
        assert other in untrained and f"{agent}:" in untrained and "<|im_start|>assistant" in untrained
        # token by token: each token's characters in the decoded completion, against the turns' spans
        full = tokenizer.decode(completion)
        own_start = full.index(own) + len(agent) + 1  # after the forced "Name:"
        own_end = own_start + len(own) - len(agent) - 1 + len("<|im_end|>")
        other_start = full.index(other)
        for k, (token, m) in enumerate(zip(completion, mask)):
            start = len(tokenizer.decode(completion[:k]))
            end = start + len(tokenizer.decode([token]))
            if other_start <= start < other_start + len(other):
                assert m == 0, f"token {k} ({tokenizer.decode([token])!r}) of {agent}'s view is the other's"
            assert m == int(own_start <= start < own_end and end <= own_end), (k, tokenizer.decode([token]))


def test_the_rollout_groups_samples_per_instance_and_routes_frozen_agents(tokenizer) -> None:
    """TRL repeats each prompt num_generations times; each copy gets its own sample of the group,
    the frozen role speaks with its own policy, and rewards reach the reward functions."""
    task = make_task("ie/synth-v0")
    trained = ScriptedPolicy(lambda r: f"trained {r.key[1] if len(r.key) > 1 else 0} <A>x</A>")
    frozen = ScriptedPolicy(lambda r: "frozen <A>y</A>")
    adapter = OptimaRollout(
        task,
        tokenizer=tokenizer,
        num_generations=3,
        sampling=SamplingParams(temperature=0.7, max_new_tokens=8),
        reward=RewardConfig(short_trajectory_tokens=None),
        frozen={"Bob": frozen},
        policy_factory=lambda trainer: trained,
        max_turns=2,
    )
    prompts = grpo_prompts(task, [0, 1], ["Alice"])
    assert parse_prompt(prompts[1]) == ("ie/synth-v0", 1, "Alice")
    with pytest.raises(Exception, match="agents \\['Carol'\\] are not agents"):
        grpo_prompts(task, [0], ["Carol"])
    repeated = [p for p in prompts for _ in range(3)]
    out = adapter(repeated, SimpleNamespace(state=SimpleNamespace(global_step=0)))
    assert len(out["completion_ids"]) == len(out["env_mask"]) == len(out["optima_reward"]) == 6
    assert out["logprobs"] is None
    groups = adapter.episodes[(0, 0)], adapter.episodes[(0, 1)]
    assert all(len(g) == 3 for g in groups) and trained.calls and frozen.calls
    for group in groups:
        assert all(e.turns[1].text.startswith("Bob: frozen") for e in group)  # Bob never trained speaks
        assert len({e.seed for e in group}) == 1  # one dealing of evidence per group
    assert out["optima_reward"] == [e.reward.total for g in groups for e in g]
    (total,) = reward_functions()
    assert total(repeated, None, **out) == out["optima_reward"]
    task_fn, token_fn, readability_fn = reward_functions(separate_terms=True)
    assert [f.__name__ for f in (task_fn, token_fn, readability_fn)] == [
        "optima_task",
        "optima_token",
        "optima_readability",
    ]
    with pytest.raises(Exception, match="is frozen"):
        adapter(grpo_prompts(task, [0], ["Bob"]), SimpleNamespace(state=SimpleNamespace(global_step=0)))


def test_a_rollout_with_two_policies_sends_each_agent_to_its_own() -> None:
    alice = ScriptedPolicy(lambda r: "<A>from alice</A>")
    bob = ScriptedPolicy(lambda r: "<A>from bob</A>")
    episodes = rollout(
        make_task("ie/synth-v0"),
        PerAgentPolicy({"Alice": alice, "Bob": bob}),
        jobs=make_jobs([0, 1, 2], 2, 0),
        sampling=SamplingParams(),
        concurrency=6,
        env_kwargs={"max_turns": 4},
    )
    for episode in episodes:
        for turn in episode.turns:
            assert turn.text == f"{turn.agent}: <A>from {turn.agent.lower()}</A>"
    assert alice.calls[0] == 6 and bob.calls[0] == 6  # each batch split by agent, one call per policy
    with pytest.raises(Exception, match="no policy for agent 'Bob'"):
        PerAgentPolicy({"Alice": alice}).generate(
            [GenerationRequest(messages=[], agent="Bob")], SamplingParams()
        )


@pytest.mark.slow
def test_one_grpo_step_through_the_adapter_changes_the_weights(tmp_path: Path) -> None:
    trl = pytest.importorskip("trl")
    import datasets
    import torch
    import transformers

    from tests.tiny_model import make_tiny_model

    folder = make_tiny_model(tmp_path / "tiny")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    task = make_task("ie/synth-v0")
    adapter = OptimaRollout(
        task,
        tokenizer=tokenizer,
        num_generations=4,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=6),
        reward=RewardConfig(short_trajectory_tokens=None),
        readability=lambda texts: [
            1.0 + len(t) / 100 for t in texts
        ],  # varies with the text: non-zero advantages
        max_turns=2,
    )
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4, max_steps=1,
        learning_rate=1e-3, max_completion_length=256, use_cpu=True, bf16=False, report_to="none",
        save_strategy="no", logging_steps=1, remove_unused_columns=False,
    )  # fmt: skip
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=reward_functions(separate_terms=True),
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": grpo_prompts(task, [0, 1, 2, 3])}),
        processing_class=tokenizer,
        rollout_func=adapter,
    )
    trainer.train()
    rewards = [e.reward.total for g in adapter.episodes.values() for e in g]
    assert len(set(rewards)) > 1  # the group had something to learn from
    changed = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "GRPO did not move any weight"
    logged = trainer.state.log_history[0]
    assert "rewards/optima_readability/mean" in logged and "rewards/optima_token/mean" in logged


@pytest.mark.slow
def test_the_grpo_backend_runs_one_iteration_from_the_cli(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from tests.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "optima_trainers.train", "--trainer", "grpo", "--task", "ie/synth-v0",
         "--model", str(model), "--profile", "cpu", "--instances", "2", "--samples", "4", "--max-turns", "2",
         "--max-new-tokens", "6", "--set", "options.steps=1", "--set", "options.train_agents=Alice",
         "--run-dir", str(run), "--no-progress"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((run / "iter_00" / "result.json").read_text())
    assert result["model"] == "iter_00/checkpoint" and (run / "iter_00" / "checkpoint" / "COMPLETE").is_file()
    metrics = result["metrics"]
    assert metrics["train/steps"] == 1 and metrics["rollout/episodes"] == 8  # 2 prompts (Alice) x 4
    assert metrics["rollout/tokens/Alice"] > 0 and metrics["rollout/tokens/Bob"] > 0
    assert "grpo/rewards/optima_task/mean" in metrics
    config = json.loads((run / "config.json").read_text())
    assert config["trainer"] == "grpo" and config["options"]["train_agents"] == ["Alice"]
