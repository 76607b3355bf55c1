"""The iterative loop end to end: a real iSFT iteration on the embedded model, the DPO wiring, hooks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from optima_env import get_plugin_manager, hookimpl
from optima_trainers import IterativeTrainer, RunDir, resolve_config
from tests.optima_trainers.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_one_isft_iteration_on_the_embedded_model_changes_the_weights(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from optima_env.models import ensure_embedded_model

    config = resolve_config(
        "ie/synth-v0", "isft", profile="cpu", model="embedded", iterations=1, instances=3, num_samples=2,
        max_turns=2, max_new_tokens=24, max_steps=1, theta_sft=-100.0, concurrency=6,
    )  # fmt: skip
    assert config.lora
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
    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[tuple[int, dict]] = []
        self.episodes = 0

    @hookimpl
    def optima_iteration_start(self, iteration, config):
        self.starts.append(iteration)

    @hookimpl
    def optima_iteration_end(self, iteration, metrics):
        self.ends.append((iteration, dict(metrics)))

    @hookimpl
    def optima_episode_end(self, episode):
        self.episodes += 1


def test_idpo_runs_init_sft_then_rpo_stage_with_hooks(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    model = make_tiny_model(tmp_path / "tiny")
    config = resolve_config(
        "ie/synth-v0", "idpo", profile="cpu", model=str(model), iterations=1, instances=3, num_samples=2,
        max_turns=3, max_new_tokens=8, max_steps=1, theta_sft=-100.0, normalizer_instances=2,
        mcts_instances=2, mcts_selections=2, mcts_rollouts=2, theta_filter=-100.0, theta_diff=0.0,
    )  # fmt: skip
    assert config.rpo_alpha == 1.0 and config.normalizer_percentile == 85.0
    pm = get_plugin_manager()
    recorder = Recorder()
    pm.register(recorder)
    metrics = IterativeTrainer(
        config, run_dir=RunDir.create(config, run_dir=tmp_path / "run"), pm=pm, progress=False
    ).run()
    assert [m["stage"] for m in metrics] == ["iter_00", "iter_01"]
    assert recorder.starts == [0, 1] and [i for i, _ in recorder.ends] == [0, 1]
    assert recorder.episodes >= 6 + 2  # the SFT rollouts and the normalizer rollouts at least
    dpo = tmp_path / "run" / "iter_01"
    normalizer = [json.loads(x) for x in (dpo / "normalizer.jsonl").read_text().splitlines()]
    counts = sorted(e["num_tokens"] for e in normalizer)
    assert metrics[1]["mcts/normalizer"] == pytest.approx(counts[0] + 0.85 * (counts[1] - counts[0]) + 1)
    assert metrics[1]["mcts/pairs"] >= 1 and (dpo / "checkpoint" / "COMPLETE").is_file()
    # cursor: SFT used instances 0-2, the normalizer 3-4, the trees 5-6
    assert sorted({e["metadata"]["job"][0] for e in normalizer}) == [3, 4]
    trees = [t for line in (dpo / "trees.jsonl").read_text().splitlines() for t in json.loads(line)["trees"]]
    assert sorted(t["index"] for t in trees) == [5, 6]
    sft, rpo = _weights(tmp_path / "run" / "iter_00" / "checkpoint"), _weights(dpo / "checkpoint")
    assert any(not sft[k].equal(rpo[k]) for k in sft)  # DPO moved the SFT model (its reference)
