"""``optima_trainers.cli.export``: a LoRA adapter extracted from (trained − base) weights.

The "trained" model is the tiny random Llama (tied embeddings) plus a known rank-2 delta on
``q_proj`` of layer 0 (64 × 64) and ``down_proj`` of layer 1 (64 × 128).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from optima_env.errors import DataError, TaskContractError
from tests.helpers import REPO_ROOT

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from optima_env.backends.peft_adapter import content_hash, file_sha256  # noqa: E402
from optima_trainers.cli.export import main  # noqa: E402
from optima_trainers.run.export import TRUNCATION_WARNING, export_lora  # noqa: E402
from tests.tiny_model import add_low_rank_delta, make_tiny_model  # noqa: E402

MODULES = ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj")
SHAPES = {MODULES[0]: (64, 64), MODULES[1]: (64, 128)}  # (out, in)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # every test of this module: torch on one thread


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    base = make_tiny_model(root / "base")
    return base, add_low_rank_delta(base, root / "trained", modules=MODULES, rank=2)


def test_the_manifest_describes_the_adapter(pair, tmp_path) -> None:
    base, trained = pair
    out = tmp_path / "adapter"
    provenance = {"command": "python -m optima_trainers.cli.export ...", "git_commit": "abc", "stage": "iter_02"}
    manifest = export_lora(str(base), trained, out, rank=4, provenance=provenance)
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["format"] == 1 and manifest["base_model"] == str(base)
    assert manifest["base_hash"] == content_hash(base) and manifest["source_hash"] == content_hash(trained)
    assert (manifest["rank"], manifest["dtype"], manifest["modules"]) == (4, "float16", 2)
    error = manifest["delta_relative_error"]
    assert 0 < error["mean"] <= error["max"] < 2e-3, error  # rank 2 carried by rank 4, fp16 rounding
    assert manifest["tokenizer"] == "base" and manifest["unchanged_max_relative_difference"] == 0
    assert manifest["provenance"] == provenance
    files = {p.name: file_sha256(p) for p in out.iterdir() if p.name != "manifest.json"}
    assert manifest["files"] == files and set(files) == {"adapter_config.json", "adapter_model.safetensors"}
    assert manifest["bytes"] == sum((out / name).stat().st_size for name in files)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base) and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 4, "LORA")
    assert config["target_modules"] == sorted(MODULES)  # lm_head is tied: left out; sorted, so the
    # bytes (and the manifest's sha256) do not depend on the hash seed of the exporting process
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a temporary folder was left"


def test_stored_factors_multiply_back_to_the_delta(pair, tmp_path) -> None:
    from safetensors.torch import load_file

    base, trained = pair
    export_lora(str(base), trained, tmp_path / "adapter", rank=2, dtype="float32")
    tensors = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    old, new = (load_file(folder / "model.safetensors") for folder in (base, trained))
    for name in MODULES:
        a = tensors[f"base_model.model.{name}.lora_A.weight"]
        b = tensors[f"base_model.model.{name}.lora_B.weight"]
        assert (
            a.dtype == torch.float32 and a.shape == (2, SHAPES[name][1]) and b.shape == (SHAPES[name][0], 2)
        )
        delta = new[f"{name}.weight"] - old[f"{name}.weight"]
        assert torch.allclose(b @ a, delta, atol=1e-5)


def test_a_rerun_returns_the_export_without_rewriting_it(pair, tmp_path, caplog) -> None:
    base, trained = pair
    out = tmp_path / "adapter"
    first = export_lora(str(base), trained, out, rank=2)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with caplog.at_level(logging.INFO, logger="optima_trainers.run.export"):
        again = export_lora(str(base), trained, out, rank=2, provenance={"ignored": True})
    assert again == first and {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    assert any("already holds this export" in r.getMessage() for r in caplog.records)
    weights = out / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])  # damaged: exported again
    repaired = export_lora(str(base), trained, out, rank=2)
    assert repaired["files"] == first["files"] and file_sha256(weights) == first["files"][weights.name]
    assert export_lora(str(base), trained, out, rank=3)["rank"] == 3  # another rank: recomputed


def test_changed_embeddings_are_refused_by_name(pair, tmp_path) -> None:
    base, _ = pair
    noisy = add_low_rank_delta(base, tmp_path / "noisy", also={"model.embed_tokens.weight": 0.01})
    with pytest.raises(
        DataError,
        match=r"only nn\.Linear weights, but 1 other .*: model\.embed_tokens\.weight \(\d\.\de-\d\d\); ",
    ):
        export_lora(str(base), noisy, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()
    with pytest.raises(DataError, match=r"no linear weight differs from the base .*; nothing to export"):
        export_lora(str(base), base, tmp_path / "adapter")
    with pytest.raises(TaskContractError, match="rank must be an int >= 1, got 0"):
        export_lora(str(base), base, tmp_path / "adapter", rank=0)
    with pytest.raises(TaskContractError, match="dtype must be one of"):
        export_lora(str(base), base, tmp_path / "adapter", dtype="int8")


def test_a_bfloat16_checkpoint_is_compared_with_the_base_rounded_alike(pair, tmp_path) -> None:
    base, _ = pair
    rounded = add_low_rank_delta(base, tmp_path / "bf16", modules=MODULES, rank=2, dtype="bfloat16")
    manifest = export_lora(str(base), rounded, tmp_path / "adapter", rank=2, dtype="float32")
    assert manifest["modules"] == 2 and manifest["unchanged_max_relative_difference"] == 0
    assert manifest["delta_relative_error"]["max"] < 1e-2  # the delta, less bfloat16's rounding of it


def test_fp16_adapters_take_two_bytes_a_parameter(pair, tmp_path) -> None:
    base, trained = pair
    rank = 8
    expected = sum(rank * (rows + cols) for rows, cols in SHAPES.values())  # A: r x in, B: out x r
    for dtype, width in (("float16", 2), ("float32", 4)):
        manifest = export_lora(str(base), trained, tmp_path / dtype, rank=rank, dtype=dtype)
        assert manifest["parameters"] == expected
        size = (tmp_path / dtype / "adapter_model.safetensors").stat().st_size
        assert width * expected < size < width * expected + 1024  # + the safetensors header


def test_the_command_line_round_trip(pair, tmp_path, capsys) -> None:
    base, trained = pair
    out = tmp_path / "adapter"
    args = ["--base", str(base), "--model", str(trained), "--out", str(out), "--rank", "2"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "rank-2 float16 LoRA of 2 modules" in printed and str(out) in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["provenance"]["command"].startswith("python -m optima_trainers.cli.export --base ")
    assert manifest["provenance"]["model"] == str(trained) and "git_commit" in manifest["provenance"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "optima_trainers.cli.export",
            "--model",
            str(tmp_path / "missing"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --model ") and "does not exist" in lines[0], lines


def test_a_truncating_rank_warns_and_an_exact_one_does_not(pair, tmp_path, caplog) -> None:
    base, trained = pair  # a rank-2 change
    with caplog.at_level(logging.WARNING, logger="optima_trainers.cli.export"):
        exact = export_lora(str(base), trained, tmp_path / "exact", rank=2)
    assert exact["delta_relative_error"]["mean"] < 2e-3 and not caplog.records
    with caplog.at_level(logging.WARNING, logger="optima_trainers.cli.export"):
        cut = export_lora(str(base), trained, tmp_path / "cut", rank=1)
    assert cut["delta_relative_error"]["mean"] > TRUNCATION_WARNING
    (record,) = caplog.records
    assert "rank-1 adapter" in record.getMessage() and "sum of its stages' ranks" in record.getMessage()
