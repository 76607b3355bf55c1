"""A LoRA stage keeps its adapter, and a run folder that lost its merged weights resumes: the
weights are rebuilt from the adapters, bit for bit, stage after stage (optima_trainers.run.adapters)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

from optima_env.errors import CorruptCheckpointError
from optima_trainers import IterativeTrainer, RunDir, resolve_config
from optima_trainers.config.training import DPOTrainConfig
from optima_trainers.dpo.trainer import train_dpo
from optima_trainers.run.adapters import ADAPTER_FOLDER, missing_files, restore_weights
from optima_trainers.run.checkpoint import manifest_entries, require_complete
from tests.tiny_model import add_low_rank_delta, make_tiny_model

pytestmark = pytest.mark.slow  # runs a real model: the full suite only

WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
SMALL = {
    "generation.instances": 2, "generation.num_samples": 2, "generation.max_turns": 2,
    "generation.max_new_tokens": 8, "generation.concurrency": 4, "generation.backend": "hf",
    "selection.theta": -100.0, "sft.max_steps": 1,
}  # fmt: skip


def _run(root: Path, model: Path, iterations: int) -> list[dict]:
    config = resolve_config(
        "ie/synth-v0", "isft", profile="cpu", model=str(model), iterations=iterations, overrides=SMALL
    )
    run = RunDir.open_or_create(config, root)
    return IterativeTrainer(config, run_dir=run, progress=False).run()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_a_lora_stage_keeps_its_adapter_in_the_manifest_and_a_run_without_merged_weights_resumes(
    tiny, tmp_path
) -> None:
    root = tmp_path / "run"
    _run(root, tiny, iterations=2)
    checkpoints = [root / s / "checkpoint" for s in ("iter_00", "iter_01")]
    trained = {}
    for checkpoint in checkpoints:
        files = manifest_entries(checkpoint)
        assert f"{ADAPTER_FOLDER}/adapter_model.safetensors" in files and WEIGHTS in files
        config = json.loads((checkpoint / ADAPTER_FOLDER / "adapter_config.json").read_text())
        assert config["peft_type"] == "LORA" and config["r"] == 16
        trained[checkpoint] = files[WEIGHTS]["sha256"]
        # the folder travels without its merged weights and its tokenizer (the start model's)
        for name in (WEIGHTS, TOKENIZER):
            (checkpoint / name).unlink()
        assert missing_files(checkpoint) == [WEIGHTS, TOKENIZER]
    # resuming with one iteration more needs iter_01's weights, which need iter_00's
    metrics = _run(root, tiny, iterations=3)
    assert [m["stage"] for m in metrics] == ["iter_00", "iter_01", "iter_02"]
    for checkpoint in checkpoints:
        assert missing_files(checkpoint) == []
        require_complete(checkpoint)  # every file has the sha256 the stage wrote
        assert manifest_entries(checkpoint)[WEIGHTS]["sha256"] == trained[checkpoint]
    assert require_complete(root / "iter_02" / "checkpoint").steps == 1


def test_a_dpo_stage_keeps_its_adapter_and_its_weights_are_rebuilt_from_the_start_model_only(
    tiny, tmp_path
) -> None:
    from tests.optima_trainers.dpo.test_dpo import make_pairs

    out = tmp_path / "dpo"
    train_dpo(
        model_path=str(tiny), pairs=make_pairs(3), config=DPOTrainConfig.cpu(max_length=256), output_dir=out
    )
    assert (out / ADAPTER_FOLDER / "adapter_model.safetensors").is_file()
    (out / WEIGHTS).unlink()
    other = add_low_rank_delta(tiny, tmp_path / "other")  # not the model the stage trained from
    with pytest.raises(CorruptCheckpointError, match="sha256 differs from the manifest"):
        restore_weights(out, str(other))
    assert missing_files(out) == [WEIGHTS] and not list(tmp_path.glob(".dpo.restore-*"))
    assert restore_weights(out, str(tiny)) == [WEIGHTS]
    require_complete(out)
    assert restore_weights(out, str(tiny)) == []  # nothing missing: nothing written
    # a tokenizer file is taken from the start model only when it is the same file
    (out / TOKENIZER).unlink()
    (other / TOKENIZER).write_text("{}", encoding="utf-8")
    with pytest.raises(CorruptCheckpointError, match=r"tokenizer.json: missing, and neither merging"):
        restore_weights(out, str(other))
    assert restore_weights(out, str(tiny)) == [TOKENIZER]
    require_complete(out)


def test_missing_weights_without_an_adapter_say_what_to_do(tiny, tmp_path) -> None:
    from tests.optima_trainers.dpo.test_dpo import make_pairs

    out = tmp_path / "dpo"
    train_dpo(
        model_path=str(tiny), pairs=make_pairs(3), config=DPOTrainConfig.cpu(max_length=256), output_dir=out
    )
    (out / WEIGHTS).unlink()
    shutil.rmtree(out / ADAPTER_FOLDER)
    with pytest.raises(CorruptCheckpointError, match=r"no adapter to rebuild them from.*resume the run"):
        restore_weights(out, str(tiny))
