"""The trainer-backend contract: the host calls ``stages`` and ``train(data, context)`` directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from optima_env import TrainerSpec, hookimpl
from optima_env.errors import PluginError
from optima_env.registry import get_plugin_manager, task_specs, trainer_specs
from optima_trainers import IterativeTrainer, RunDir, resolve_config
from optima_trainers.backends.contract import StageContext, TrainerBackend
from optima_trainers.run.stages import Stage, StageData, StageOutcome


class Recording(TrainerBackend):
    """Two online stages; records what the host hands each ``train`` call; trains nothing."""

    name = "recording"
    calls: list[tuple[StageData, StageContext]] = []

    def stages(self, config):
        return [Stage(name=f"iter_{i:02d}", kind="probe", number=i, generate="none") for i in range(2)]

    def train(self, data, context):
        Recording.calls.append((data, context))
        return StageOutcome(result=None, metrics={"probe/instances": float(len(data.instances))})


class Plugin:
    def __init__(self, factory: Any) -> None:
        self.factory = factory

    @hookimpl
    def optima_register_trainers(self):
        return [TrainerSpec(name="recording", factory=self.factory, description="test backend")]


def _trainer(tmp_path: Path, factory: Any) -> IterativeTrainer:
    pm = get_plugin_manager()
    pm.register(Plugin(factory))
    config = resolve_config(task_specs(pm)["ie/synth-v0"], trainer_specs(pm)["recording"],
                            overrides={"generation.instances": 3})  # fmt: skip
    return IterativeTrainer(config, run_dir=RunDir.create(config, run_dir=tmp_path / "run"), pm=pm, progress=False)


def test_the_host_calls_its_backend_with_the_stage_data_and_one_context(tmp_path: Path) -> None:
    Recording.calls.clear()
    trainer = _trainer(tmp_path, Recording)
    metrics = trainer.run()
    assert [m["stage"] for m in metrics] == ["iter_00", "iter_01"]
    assert [m["probe/instances"] for m in metrics] == [3.0, 3.0]
    (first, ctx0), (second, ctx1) = Recording.calls
    assert first.instances == (0, 1, 2) and second.instances == (3, 4, 5)  # the cursor moves on
    assert (ctx0.stage.name, ctx1.stage.name) == ("iter_00", "iter_01")
    assert ctx0.config is trainer.config and ctx0.task is trainer.task
    assert ctx0.start_model == ctx1.start_model == trainer.base_model  # nothing trained: carried over
    assert ctx0.output_dir == tmp_path / "run" / "iter_00" / "checkpoint"
    assert ctx0.events is trainer.pm.hook
    assert callable(ctx0.load_policy) and callable(ctx0.readability)


def test_a_factory_that_does_not_build_a_backend_is_refused(tmp_path: Path) -> None:
    class NotABackend:
        def __init__(self, config) -> None:
            pass

    with pytest.raises(PluginError, match="expected an optima_trainers.backends.contract.TrainerBackend"):
        _trainer(tmp_path, NotABackend)


def test_a_backend_must_return_a_stage_outcome(tmp_path: Path) -> None:
    class Sloppy(Recording):
        def train(self, data, context):
            return {"loss": 1.0}

    with pytest.raises(PluginError, match="train\\(\\) must return"):
        _trainer(tmp_path, Sloppy).run()


def test_the_contract_is_abstract() -> None:
    class Half(TrainerBackend):
        def stages(self, config):
            return []

    with pytest.raises(TypeError, match="train"):
        Half(None)
