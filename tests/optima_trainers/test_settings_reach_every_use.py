"""Each run setting has one home that every use reads: the run's reward weights reach every reward
it computes (sampled and tree), a recipe's tree weight gives way to the user's reward weight, a
config stored with the former tree-reward section reads as the same run, the library's tree
defaults are the CLI's ``code`` presets, and the tree search built through the Python API with the
run's tree configuration gives the run's trees.

One iDPO run (initialization + one tree stage) of the tiny model through the real CLI, with
``--set reward.lambda_token=0.4``, serves both tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optima_env.io import read_episodes
from optima_env.types import Episode
from optima_trainers.cli.train import main
from optima_trainers.config.env import EnvSettings
from optima_trainers.config.train import TrainConfig, TreeSearchConfig, resolve_config
from tests.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow  # runs a real model: the full suite only

SETS = {
    "reward.lambda_token": "0.4",
    # every episode's token term is then -λ_token · tokens / normalizer (no special case replaces it)
    "reward.large_turn_penalty": "false",
    "reward.short_trajectory_tokens": "0",
    "generation.instances": "3", "generation.num_samples": "2", "generation.max_turns": "3",
    "generation.max_new_tokens": "8", "sft.max_steps": "1", "dpo.max_steps": "1", "selection.theta": "-100",
    "tree.normalizer_instances": "2", "tree.instances": "2", "tree.selections": "2", "tree.rollouts": "2",
    "tree.theta_filter": "-100", "tree.theta_diff": "0",
    "generation.precision": "float32",  # trees replayed through the API equal the run's in fp32 only
}  # fmt: skip


@pytest.fixture(scope="module")
def idpo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("trl")
    root = tmp_path_factory.mktemp("one_home")
    model = make_tiny_model(root / "tiny")
    argv = ["--task", "ie/synth-v0", "--trainer", "idpo", "--profile", "cpu", "--model", str(model),
            "--iterations", "1", "--run-dir", str(root / "run"), "--no-progress"]  # fmt: skip
    for name, value in SETS.items():
        argv += ["--set", f"{name}={value}"]
    assert main(argv) == 0
    return root / "run"


def _token_weight(episode: Episode) -> float:
    reward = episode.reward
    assert reward is not None and not reward.flags, reward
    return round(-reward.token * reward.normalizer / reward.num_tokens, 9)


def test_a_reward_weight_set_once_reaches_the_sampled_and_the_tree_rewards(idpo_run: Path) -> None:
    config = TrainConfig.from_dict(json.loads((idpo_run / "config.json").read_text()))
    assert config.reward.lambda_token == 0.4 and config.tree_reward.lambda_token == 0.4
    sampled = read_episodes(idpo_run / "iter_00" / "scored.jsonl")
    trees = [t for line in (idpo_run / "iter_01" / "trees.jsonl").read_text().splitlines()
             for t in json.loads(line)["trees"]]  # fmt: skip
    tree_episodes = [Episode.from_dict(e) for t in trees for e in t["trajectories"]]
    assert sampled and tree_episodes
    assert {_token_weight(e) for e in sampled} == {_token_weight(e) for e in tree_episodes} == {0.4}
    # the tree reward is the run's, except that impersonation zeroes the task term (spec §3)
    assert config.tree_reward.impersonation == "mcts" and config.reward.impersonation == "sft"


def test_a_recipes_own_tree_weight_gives_way_to_the_users_reward_weight() -> None:
    recipe = resolve_config("debate/arc_challenge-v0", "idpo", profile="paper")
    assert (recipe.reward.lambda_token, recipe.tree_reward.lambda_token) == (0.5, 0.4)  # Table 8
    user = resolve_config("debate/arc_challenge-v0", "idpo", profile="paper",
                          overrides={"reward.lambda_token": "0.3"})  # fmt: skip
    assert user.reward.lambda_token == user.tree_reward.lambda_token == 0.3 and user.tree.lambda_token is None
    both = resolve_config("debate/arc_challenge-v0", "idpo", profile="paper",
                          overrides={"reward.lambda_token": 0.3, "tree.lambda_token": 0.2})  # fmt: skip
    assert (both.reward.lambda_token, both.tree_reward.lambda_token) == (0.3, 0.2)
    # λ_loss keeps the recipe's tree value: the user set only λ_token
    assert user.tree_reward.lambda_loss == recipe.tree_reward.lambda_loss == 0.7


def test_library_tree_defaults_are_the_cli_code_presets() -> None:
    """Every tree setting that no profile, trainer or task recipe sizes has the same value in
    ``TreeSearchConfig()`` (what the Python API builds with) as in the CLI's resolved run."""
    sized = {"instances", "normalizer_instances", "selections", "rollouts", "normalizer_percentile",
             "theta_filter", "theta_diff", "lambda_token", "lambda_loss"}  # fmt: skip
    library = TreeSearchConfig().__class__.__dataclass_fields__
    for task in ("ie/synth-v0", "ie/hotpotqa-v0", "debate/gsm8k-v0"):
        for trainer in ("idpo", "isft-dpo"):
            cli = resolve_config(task, trainer).tree
            for name in library:
                if name not in sized:
                    assert getattr(cli, name) == getattr(TreeSearchConfig(), name), (task, trainer, name)


def test_trees_built_through_the_python_api_equal_the_runs_tree_stage(idpo_run: Path) -> None:
    from optima_env.backends.loading import load_policy
    from optima_env.episode_scorer import EpisodeScorer
    from optima_env.registry import get_plugin_manager, make_task
    from optima_env.reward import percentile_normalizer
    from optima_trainers.generation.rollouts import load_readability_scorer
    from optima_trainers.run.stages import stage_seed
    from optima_trainers.tree.search import build_trees

    config = TrainConfig.from_dict(json.loads((idpo_run / "config.json").read_text()))
    task, pm = make_task(config.task), get_plugin_manager()
    num_train = len(task.samples(config.split))
    counts = [e.num_tokens for e in read_episodes(idpo_run / "iter_01" / "normalizer.jsonl")]
    tree_cfg, gen = config.tree, config.generation
    normalizer = percentile_normalizer(
        counts, tree_cfg.normalizer_percentile, rounding=tree_cfg.normalizer_rounding
    )
    policy = load_policy(str(idpo_run / "iter_00" / "checkpoint"), backend="hf", batch_size=gen.batch_size,
                         dtype=config.dtype, precision=gen.precision)  # fmt: skip
    first = gen.instances + tree_cfg.normalizer_instances  # the cursor after the init and normalizer
    positions = list(range(first, first + tree_cfg.instances))
    reward = EpisodeScorer(config.tree_reward, normalizer=normalizer, cache_turns=True,
                           readability=load_readability_scorer(config, pm))  # fmt: skip
    env = EnvSettings(tokenizer=policy.tokenizer, scoring=False, pm=pm)
    trees = build_trees(task, policy, [p % num_train for p in positions], reward_fn=reward.score,
                        split=config.split, env=env, seed=stage_seed(config.seed, "iter_01"), search=tree_cfg, generation=gen,
                        keys=positions)  # fmt: skip
    stored = [t for line in (idpo_run / "iter_01" / "trees.jsonl").read_text().splitlines()
              for t in json.loads(line)["trees"]]  # fmt: skip
    assert [t.sample_id for t in trees] == [t["sample_id"] for t in stored]
    for tree, record in zip(trees, stored):
        assert [e.to_dict() for e in (x.episode for x in tree.trajectories)] == record["trajectories"]
        assert [p.to_dict() for p in tree.pairs()] == record["pairs"]
        assert len(tree.nodes) == record["nodes"]
