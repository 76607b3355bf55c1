"""Each stage's weights reach vLLM servers as the stages' own LoRA adapters stacked: one adapter
whose weight change is exactly the sum of theirs (optima_trainers.run.adapters.stack_adapters,
optima_trainers.generation.servers). Real PEFT adapters on a tiny model, real loopback servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("peft")

from optima_env.errors import DataError
from optima_trainers import resolve_config
from optima_trainers.generation.engines import PolicyLoader
from optima_trainers.generation.servers import SERVER_LORA_SUFFIX, STACKED_RECORD
from optima_trainers.run.adapters import ADAPTER_FOLDER, save_lora_checkpoint, stack_adapters
from tests.optima_env.backends.test_openai import LoraServer
from tests.tiny_model import make_tiny_model


def lora_stage(start: Path, out: Path, *, seed: int, r: int, alpha: int, rslora: bool = False) -> Path:
    """A LoRA stage trained from ``start``: random nonzero factors (as after some steps), saved as
    the trainers save a stage (the merged model and ``adapter/``)."""
    import peft
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules="all-linear", use_rslora=rslora,
                             task_type="CAUSAL_LM")  # fmt: skip
    model = peft.get_peft_model(model, config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    save_lora_checkpoint(model, out)
    transformers.AutoTokenizer.from_pretrained(start).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def stages(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("stages")
    base = make_tiny_model(root / "base")
    first = lora_stage(base, root / "iter_00" / "checkpoint", seed=1, r=4, alpha=8)
    second = lora_stage(first, root / "iter_01" / "checkpoint", seed=2, r=2, alpha=4, rslora=True)
    return base, first, second


def test_the_stacked_adapter_on_the_base_is_the_last_stages_model(stages, tmp_path) -> None:
    import peft
    import torch
    import transformers

    from optima_trainers.run.lora_svd import write_adapter

    base, first, second = stages
    factors, rank = stack_adapters([first / ADAPTER_FOLDER, second / ADAPTER_FOLDER])
    assert rank == 4 + 2
    write_adapter(tmp_path / "stacked", factors, base_model=str(base), rank=rank)
    load = transformers.AutoModelForCausalLM.from_pretrained
    served = peft.PeftModel.from_pretrained(load(base, dtype=torch.float32), str(tmp_path / "stacked"))
    trained = load(second, dtype=torch.float32)
    ids = torch.tensor([[1, 17, 230, 5, 99, 4000, 12]])
    with torch.no_grad():
        assert torch.allclose(served(ids).logits, trained(ids).logits, atol=1e-5)
        merged = served.merge_and_unload().state_dict()
    worst = max((merged[k] - v).abs().max().item() for k, v in trained.state_dict().items())
    assert worst < 1e-6  # the sum of the stages' changes, up to fp32 rounding
    changed = load(first, dtype=torch.float32).state_dict()
    assert max((changed[k] - v).abs().max().item() for k, v in trained.state_dict().items()) > 1e-3


def test_an_adapter_that_does_not_stack_is_refused(stages, tmp_path) -> None:
    _, first, _ = stages
    dora = tmp_path / "dora"
    dora.mkdir()
    config = json.loads((first / ADAPTER_FOLDER / "adapter_config.json").read_text(encoding="utf-8"))
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}), encoding="utf-8")
    with pytest.raises(DataError, match=r"\['use_dora'\] set; only plain LoRA adapters stack exactly"):
        stack_adapters([first / ADAPTER_FOLDER, dora])


def test_each_stage_reaches_the_servers_as_its_stacked_adapter(stages) -> None:
    """The loader learns each stage's start model from the host and loads the stack of both
    stages' adapters on every server, once; a stage without an adapter of its own (full
    fine-tuning) has no stack and goes through the SVD export instead."""
    base, first, second = stages
    with LoraServer() as a, LoraServer() as b:
        overrides = {"generation.backend": "openai", "generation.base_urls": [a.url, b.url]}
        config = resolve_config("ie/synth-v0", "isft", profile="cpu", model=str(base), overrides=overrides)
        loader = PolicyLoader(config, free_for_engine=lambda: None)
        loader.record_stage(str(first), str(base))
        loader.record_stage(str(second), str(first))
        try:
            policy = loader.load(str(second))
            served = second.with_name(second.name + SERVER_LORA_SUFFIX)
            assert a.loads() == b.loads() == [(policy.model, str(served.resolve()))]
            stacked = json.loads((served / STACKED_RECORD).read_text(encoding="utf-8"))
            chain = [str(first / ADAPTER_FOLDER), str(second / ADAPTER_FOLDER)]
            assert stacked["rank"] == 6 and stacked["adapters"] == chain
            assert json.loads((served / "adapter_config.json").read_text(encoding="utf-8"))["r"] == 6
            written = (served / "adapter_model.safetensors").stat().st_mtime_ns
            loader.release(policy)
            loader._serving = None  # as a new run on the same folder: the stack is verified and kept
            assert loader.load(str(second)).model == policy.model
            assert (served / "adapter_model.safetensors").stat().st_mtime_ns == written
        finally:
            loader.close()
    assert loader.lineage == {str(first.resolve()): tuple(chain[:1]), str(second.resolve()): tuple(chain)}
    full = PolicyLoader(config, free_for_engine=lambda: None)
    full.record_stage(str(base.parent / "elsewhere"), str(base))  # a folder without adapter/
    assert full.lineage == {str((base.parent / "elsewhere").resolve()): None}
