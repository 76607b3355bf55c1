"""Adapter folders for evaluation: an exported LoRA loads through the backends like the model it
was exported from, and a damaged one is refused with a clear error.

The "trained" model is the tiny random Llama (untied embeddings: its greedy text varies, where the
tied one repeats a token) plus a known rank-2 delta on two linear layers, so a rank-2 export in
float32 carries it exactly (up to float rounding). Every model runs on one thread.
"""

from __future__ import annotations

import json
import shutil

import pytest

from optima_env.errors import DataError, TaskContractError
from optima_env.policy import SamplingParams
from tests.optima_env.backends.backend_contract import chat_requests

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from optima_env.backends import peft_adapter  # noqa: E402
from optima_env.backends.hf import TransformersPolicy, render_prompt  # noqa: E402
from optima_env.backends.loading import load_policy  # noqa: E402
from optima_trainers.run.export import export_lora  # noqa: E402
from tests.tiny_model import add_low_rank_delta, make_tiny_model  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_new_tokens=12)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # every test of this module: torch on one thread


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(base, trained, adapter) folders: the adapter is a float32 rank-2 export of the delta."""
    root = tmp_path_factory.mktemp("adapter")
    base = make_tiny_model(root / "base", tie_word_embeddings=False)
    trained = add_low_rank_delta(base, root / "trained", rank=2, scale=0.05)
    export_lora(str(base), trained, root / "adapter", rank=2, dtype="float32", provenance={"stage": "test"})
    return base, trained, root / "adapter"


@pytest.fixture(scope="module")
def trained_policy(folders):
    return load_policy(str(folders[1]), backend="hf", batch_size=4, precision="float32")


def _logits(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


@pytest.mark.slow
def test_an_exported_adapter_generates_like_the_trained_model_on_the_hf_backend(
    folders, trained_policy
) -> None:
    base, _, adapter = folders
    # float32: merged weights and base plus delta round differently in a bf16 decode
    policy = load_policy(str(adapter), backend="hf", batch_size=4, precision="float32")
    assert isinstance(policy, TransformersPolicy) and policy.fast
    assert policy.tokenizer is not None and policy.tokenizer.padding_side == "left"
    requests = chat_requests(5)
    ids = policy.tokenizer(render_prompt(policy.tokenizer, requests[3]), add_special_tokens=False).input_ids
    got, expected = _logits(policy.model, ids), _logits(trained_policy.model, ids)
    assert torch.allclose(got, expected, atol=1e-4, rtol=0), float((got - expected).abs().max())
    untrained = TransformersPolicy.from_pretrained(str(base), batch_size=4, precision="float32")
    assert float((_logits(untrained.model, ids) - expected).abs().max()) > 1e-2, "the delta changes nothing"
    replies = policy.generate(requests, GREEDY)
    assert replies == trained_policy.generate(requests, GREEDY)
    assert replies != untrained.generate(requests, GREEDY)


def test_an_adapter_names_its_base_and_embedded_resolves_offline(folders, tmp_path) -> None:
    from optima_env.models import ensure_embedded_model

    base, trained, adapter = folders
    assert peft_adapter.is_adapter(adapter) and not peft_adapter.is_adapter(trained)
    assert not peft_adapter.is_adapter("embedded")
    assert peft_adapter.adapter_base(adapter) == base
    assert peft_adapter.content_hash(adapter) != peft_adapter.content_hash(trained)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": "embedded"})
    )
    assert peft_adapter.adapter_base(tmp_path) == ensure_embedded_model()
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": ""}))
    with pytest.raises(DataError, match="'base_model_name_or_path' is ''; set it to the base model"):
        peft_adapter.adapter_base(tmp_path)


def test_a_corrupted_adapter_file_is_a_data_error_naming_it(folders, tmp_path) -> None:
    import benchmarks.evaluation.policies as bench

    manifest = peft_adapter.verify_manifest(folders[2])
    assert manifest is not None and set(manifest["files"]) == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    broken = shutil.copytree(folders[2], tmp_path / "broken")
    weights = broken / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    expected = manifest["files"]["adapter_model.safetensors"]
    pattern = rf"safetensors: expected sha256 {expected} .*, got [0-9a-f]{{64}}.*export the adapter again"
    with pytest.raises(DataError, match=pattern):
        peft_adapter.verify_manifest(broken)
    with pytest.raises(DataError, match="expected sha256"):
        peft_adapter.load_merged(broken)
    with pytest.raises(DataError, match="expected sha256"):  # the benchmarks' checkpoint verification
        bench.load_policy(str(broken), backend="hf", batch_size=2)
    weights.unlink()
    with pytest.raises(
        DataError, match=r"adapter_model\.safetensors: listed in .*manifest\.json but missing"
    ):
        peft_adapter.verify_manifest(broken)
    (broken / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="expected JSON"):
        peft_adapter.verify_manifest(broken)


def test_the_benchmarks_accept_a_verified_adapter_and_vllm_refuses_one(folders, trained_policy) -> None:
    import benchmarks.evaluation.policies as bench

    policy, tokenizer = bench.load_policy(str(folders[2]), backend="hf", batch_size=2, precision="float32")
    assert tokenizer is policy.tokenizer and tokenizer is not None
    requests = chat_requests(2)
    assert policy.generate(requests, GREEDY) == trained_policy.generate(requests, GREEDY)
    with pytest.raises(
        TaskContractError, match=r"backend vllm loads full model folders.*--backend hf \(it merges"
    ):
        load_policy(str(folders[2]), backend="vllm")


def test_an_adapter_with_its_own_tokenizer_brings_it(folders, tmp_path) -> None:
    base, trained, _ = folders
    retokenized = shutil.copytree(trained, tmp_path / "trained")
    config = json.loads((retokenized / "tokenizer_config.json").read_text())
    config["model_max_length"] = 1234
    (retokenized / "tokenizer_config.json").write_text(json.dumps(config))
    manifest = export_lora(str(base), retokenized, tmp_path / "adapter", rank=2, dtype="float32")
    assert manifest["tokenizer"] == "adapter" and "tokenizer_config.json" in manifest["files"]
    model, tokenizer = peft_adapter.load_merged(tmp_path / "adapter", device="cpu")
    assert tokenizer.model_max_length == 1234 and tokenizer.padding_side == "left"
    assert not model.training
