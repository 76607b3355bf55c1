"""The host loop end to end with real models and real TRL trainers: the trainer hooks, the one reward.

``test_hook_*`` functions are the per-hook tests of the training hooks (``tests/test_hooks.py``
checks that every hookspec has one).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from optima_env import get_plugin_manager, hookimpl
from optima_env.io import read_episodes
from optima_trainers import IterativeTrainer, RunDir, resolve_config
from optima_trainers.run.stages import Stage, StageData
from tests.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow

IDPO = {
    "generation.instances": 3, "generation.num_samples": 2, "generation.max_turns": 3,
    "generation.max_new_tokens": 8, "sft.max_steps": 1, "dpo.max_steps": 1, "selection.theta": -100.0,
    "tree.normalizer_instances": 2, "tree.instances": 2, "tree.selections": 2, "tree.rollouts": 2,
    "tree.theta_filter": -100.0, "tree.theta_diff": 0.0,
}  # fmt: skip


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_one_isft_iteration_on_the_embedded_model_changes_the_weights(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from optima_env.models import ensure_embedded_model

    config = resolve_config(
        "ie/synth-v0", "isft", profile="cpu", model="embedded", iterations=1,
        overrides={"generation.instances": 3, "generation.num_samples": 2, "generation.max_turns": 2,
                   "generation.max_new_tokens": 24, "sft.max_steps": 1, "selection.theta": -100.0,
                   "generation.concurrency": 6},
    )  # fmt: skip
    assert config.sft.lora
    metrics = IterativeTrainer(
        config, run_dir=RunDir.create(config, run_dir=tmp_path / "run"), progress=False
    ).run()
    stage = tmp_path / "run" / "iter_00"
    assert (stage / "checkpoint" / "COMPLETE").is_file()
    assert len((stage / "episodes.jsonl").read_text().splitlines()) == 6
    (record,) = metrics
    assert (
        record["select/selected"] == 2 and record["train/steps"] == 1 and math.isfinite(record["train/loss"])
    )
    trained, base = _weights(stage / "checkpoint"), _weights(ensure_embedded_model())
    assert not any(k.startswith("base_model") or "lora" in k for k in trained)  # merged, plain folder
    changed = [k for k in trained if not trained[k].equal(base[k])]
    assert changed and all(".layers." in k for k in changed)  # LoRA touched the blocks' linear layers only


class Recorder:
    """A third-party plugin observing every training hook."""

    def __init__(self) -> None:
        self.configured: list[dict] = []
        self.starts: list[int] = []
        self.ends: list[tuple[int, dict]] = []
        self.env_episodes: list[Any] = []
        self.scored: list[tuple[str, Any]] = []
        self.delivered: list[tuple[str, StageData]] = []
        self.selections: list[str] = []

    @hookimpl
    def optima_configure(self, config):
        self.configured.append(dict(config))

    @hookimpl
    def optima_iteration_start(self, iteration, config):
        self.starts.append(iteration)

    @hookimpl
    def optima_iteration_end(self, iteration, metrics):
        self.ends.append((iteration, dict(metrics)))

    @hookimpl
    def optima_episode_end(self, episode):
        self.env_episodes.append(episode)

    @hookimpl
    def optima_episode_scored(self, episode, stage):
        self.scored.append((stage.name, episode))

    @hookimpl
    def optima_generation_end(self, stage, data):
        self.delivered.append((stage.name, data))

    @hookimpl
    def optima_select_training_data(self, episodes, trainer, config):
        self.selections.append(config["stage"])  # defer to the built-in selection


@pytest.fixture(scope="module")
def idpo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Recorder, list[dict]]:
    pytest.importorskip("trl")
    root = tmp_path_factory.mktemp("idpo")
    model = make_tiny_model(root / "tiny")
    config = resolve_config(
        "ie/synth-v0", "idpo", profile="cpu", model=str(model), iterations=1, overrides=IDPO
    )
    pm = get_plugin_manager()
    recorder = Recorder()
    pm.register(recorder)
    metrics = IterativeTrainer(
        config, run_dir=RunDir.create(config, run_dir=root / "run"), pm=pm, progress=False
    ).run()
    return root / "run", config, recorder, metrics


def test_idpo_runs_init_sft_then_rpo_stage(idpo_run) -> None:
    run, config, _, metrics = idpo_run
    assert config.dpo.rpo_alpha == 1.0 and config.tree.normalizer_percentile == 85.0
    assert [m["stage"] for m in metrics] == ["iter_00", "iter_01"]
    dpo = run / "iter_01"
    normalizer = [json.loads(x) for x in (dpo / "normalizer.jsonl").read_text().splitlines()]
    counts = sorted(e["num_tokens"] for e in normalizer)
    # the reference: int(85th percentile) + 1 (numpy's linear interpolation between the two counts)
    assert metrics[1]["mcts/normalizer"] == int(counts[0] + 0.85 * (counts[1] - counts[0])) + 1
    assert metrics[1]["mcts/pairs"] >= 1 and (dpo / "checkpoint" / "COMPLETE").is_file()
    # cursor: SFT used instances 0-2, the normalizer 3-4, the trees 5-6
    assert sorted({e["metadata"]["job"][0] for e in normalizer}) == [3, 4]
    trees = [t for line in (dpo / "trees.jsonl").read_text().splitlines() for t in json.loads(line)["trees"]]
    assert sorted(t["index"] for t in trees) == [5, 6]
    sft, rpo = _weights(run / "iter_00" / "checkpoint"), _weights(dpo / "checkpoint")
    assert any(not sft[k].equal(rpo[k]) for k in sft)  # DPO moved the SFT model (its reference)


def test_hook_optima_configure(idpo_run) -> None:
    _, config, recorder, _ = idpo_run
    assert recorder.configured == [config.to_dict()]


def test_hook_optima_iteration_start(idpo_run) -> None:
    assert idpo_run[2].starts == [0, 1]


def test_hook_optima_iteration_end(idpo_run) -> None:
    _, _, recorder, metrics = idpo_run
    assert [i for i, _ in recorder.ends] == [0, 1]
    assert recorder.ends[1][1]["mcts/pairs"] == metrics[1]["mcts/pairs"]


def test_hook_optima_episode_end(idpo_run) -> None:
    """The env reports each episode it plays; in a training run it does not score them (the run's
    reward depends on the instance group and the readability model, computed afterwards)."""
    _, _, recorder, _ = idpo_run
    assert len(recorder.env_episodes) >= 6 + 2  # the SFT rollouts and the normalizer rollouts at least
    assert all(e.reward is None for e in recorder.env_episodes)


def test_hook_optima_episode_scored(idpo_run) -> None:
    """A plugin on the episode hook sees exactly the rewards that selection and the pairs used."""
    run, config, recorder, _ = idpo_run
    sft = [e for stage, e in recorder.scored if stage == "iter_00"]
    stored = read_episodes(run / "iter_00" / "scored.jsonl")
    assert [e.reward for e in sft] == [e.reward for e in stored] and len(sft) == 6
    for episode in sft:  # the run's reward: group max normalizer, readability from the frozen model
        group = [e.num_tokens for e in sft if e.sample_id == episode.sample_id]
        assert episode.reward.normalizer == max(group) and episode.lm_loss is not None
        assert episode.reward.readability == pytest.approx(config.reward.lambda_loss / episode.lm_loss) or (
            episode.reward.flags and episode.reward.readability in (0.0, -1.0)
        )
    selected = read_episodes(run / "iter_00" / "selected.jsonl")
    seen = {(e.sample_id, e.seed, tuple(t.text for t in e.turns)): e.reward for e in sft}
    assert selected and all(
        seen[(e.sample_id, e.seed, tuple(t.text for t in e.turns))] == e.reward for e in selected
    )
    tree = [e for stage, e in recorder.scored if stage == "iter_01"]
    normalizer = json.loads((run / "iter_01" / "result.json").read_text())["metrics"]["mcts/normalizer"]
    assert len(tree) == 2 * 2 * 2  # trees x selections x rollouts
    assert all(e.reward.normalizer == normalizer for e in tree)  # the tree search's constant normalizer


def test_hook_optima_generation_end(idpo_run) -> None:
    run, _, recorder, _ = idpo_run
    assert [name for name, _ in recorder.delivered] == ["iter_00", "iter_01"]
    sft, tree = recorder.delivered[0][1], recorder.delivered[1][1]
    assert list(sft.selected) == read_episodes(run / "iter_00" / "selected.jsonl")
    assert len(sft.episodes) == 6 and not sft.pairs
    assert tree.pairs and len(tree.episodes) == 8 and not tree.selected
    assert [p.to_dict() for p in tree.pairs] == [
        json.loads(line) for line in (run / "iter_01" / "pairs.jsonl").read_text().splitlines()
    ]


def test_hook_optima_select_training_data(idpo_run) -> None:
    assert idpo_run[2].selections == ["iter_00"]  # only sampled stages select


def test_the_run_plays_the_stages_its_backend_declares(idpo_run) -> None:
    _, config, _, metrics = idpo_run
    from optima_trainers.backends.contract import IDPOBackend

    stages = IDPOBackend(config).stages(config)  # what the run asked for
    assert [(s.name, s.generate, s.start) for s in stages] == [
        ("iter_00", "samples", "base"),
        ("iter_01", "tree", "previous"),
    ]
    assert [m["stage"] for m in metrics] == [s.name for s in stages]


def test_the_backend_trained_each_stage_from_the_model_it_names(idpo_run) -> None:
    """The built-in backend trained each stage from the model the stage names and returned it."""
    run, _, _, metrics = idpo_run
    results = [json.loads((run / s / "result.json").read_text()) for s in ("iter_00", "iter_01")]
    assert [r["model"] for r in results] == ["iter_00/checkpoint", "iter_01/checkpoint"]
    assert metrics[0]["train/steps"] == 1 and metrics[1]["train/steps"] == 1
    assert Stage(name="x", kind="sft", number=0).start == "previous"


def test_sft_train_capped_turns_off_leaves_the_turns_the_cap_cut_untrained(tmp_path: Path) -> None:
    """``sft.train_capped_turns=False`` reaches the SFT stage with the generation cap: the selected
    own turns of ``generation.max_new_tokens`` tokens or more are counted and not trained."""
    pytest.importorskip("trl")
    model = make_tiny_model(tmp_path / "tiny")
    config = resolve_config(
        "ie/synth-v0", "isft", profile="cpu", model=str(model), iterations=1,
        overrides={"generation.instances": 2, "generation.num_samples": 2, "generation.max_turns": 2,
                   "generation.max_new_tokens": 6, "sft.max_steps": 1, "selection.theta": -100.0,
                   "sft.train_capped_turns": False},
    )  # fmt: skip
    run = RunDir.create(config, run_dir=tmp_path / "run")
    (record,) = IterativeTrainer(config, run_dir=run, progress=False).run()
    selected = read_episodes(tmp_path / "run" / "iter_00" / "selected.jsonl")
    capped = sum(t.num_tokens >= 6 for e in selected for t in e.turns)
    assert selected and capped >= 1 and record["train/capped_turns"] == capped


def test_one_role_trains_while_the_other_speaks_with_a_fixed_model(tmp_path: Path) -> None:
    """``generation.agent_models``: Bob speaks with his own fixed model; only Alice's turns train."""
    pytest.importorskip("trl")
    alice, bob = make_tiny_model(tmp_path / "alice", seed=0), make_tiny_model(tmp_path / "bob", seed=1)
    config = resolve_config(
        "ie/synth-v0", "isft", profile="cpu", model=str(alice), iterations=1,
        overrides={"generation.instances": 2, "generation.num_samples": 2, "generation.max_turns": 2,
                   "generation.max_new_tokens": 6, "sft.max_steps": 1, "selection.theta": -100.0,
                   "generation.agent_models": {"Bob": str(bob)}},
    )  # fmt: skip
    trainer = IterativeTrainer(
        config, run_dir=RunDir.create(config, run_dir=tmp_path / "run"), progress=False
    )
    policy = trainer.generation._policy(str(alice))
    assert policy.policy_for("Bob") is not policy.policy_for("Alice")
    (record,) = trainer.run()
    selected = int(record["select/selected"])
    assert selected >= 1 and record["train/skipped_fixed_role"] == selected  # Bob's views: not trained
    assert record["train/examples"] == selected and record["train/steps"] == 1  # Alice's views only
    with pytest.raises(Exception, match="must name some \\(not all\\)"):
        IterativeTrainer(
            config.replace(**{"generation.agent_models": {"Alice": "x", "Bob": "y"}}),
            run_dir=RunDir.create(config, run_dir=tmp_path / "other"),
            progress=False,
        )
