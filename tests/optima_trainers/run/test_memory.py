"""The memory lifecycle: nothing a finished training phase held stays alive.

The trainers keep weak references to each phase's model, reference model and trainer
(``optima_trainers.run.memory.track``); a weak reference does not keep its object alive, so an object
still reachable after the phase is a real leak (an accelerate wrapper, a merged copy, a trainer).
"""

from __future__ import annotations

import math

import pytest

from optima_trainers.run import memory


def test_the_tracker_sees_a_live_object_and_forgets_a_freed_one() -> None:
    class Big:
        pass

    kept, dropped = Big(), Big()
    memory.track("kept", kept)
    memory.track("dropped", dropped)
    del dropped
    assert memory.live() == ["kept"]
    del kept
    assert memory.live() == []


@pytest.mark.slow
def test_a_dpo_stage_releases_its_model_reference_and_trainer(tmp_path) -> None:
    pytest.importorskip("trl")
    from optima_trainers.config.training import DPOTrainConfig
    from optima_trainers.dpo.trainer import train_dpo
    from tests.optima_trainers.dpo.test_dpo import make_pairs
    from tests.tiny_model import make_tiny_model

    assert memory.live() == []
    model = make_tiny_model(tmp_path / "tiny")
    config = DPOTrainConfig.cpu(learning_rate=1e-3, rpo_alpha=1.0, max_length=256)
    result = train_dpo(model_path=str(model), pairs=make_pairs(5), config=config, output_dir=tmp_path / "out")
    assert math.isfinite(result.train_loss)
    assert memory.live() == []


@pytest.mark.slow
def test_an_isft_run_leaves_no_model_or_trainer_alive(tmp_path) -> None:
    pytest.importorskip("trl")
    from optima_trainers import IterativeTrainer, RunDir, resolve_config
    from tests.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    sizes = {"generation.instances": 2, "generation.num_samples": 2, "generation.max_turns": 2,
             "generation.max_new_tokens": 8, "sft.max_steps": 1, "selection.theta": -100.0}  # fmt: skip
    config = resolve_config("ie/synth-v0", "isft", profile="cpu", model=str(model), iterations=2, overrides=sizes)
    IterativeTrainer(config, run_dir=RunDir.create(config, run_dir=tmp_path / "run"), progress=False).run()
    assert memory.live() == []  # both SFT stages' models and trainers are gone
