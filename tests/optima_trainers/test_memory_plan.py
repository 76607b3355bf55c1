"""The GPU memory plan (``optima_trainers.run.memory_plan``): Llama 3 8B's sizes on one 80 GB and
one 141 GB card, and on eight 80 GB cards, pinned, for both designs of the run's engine (weights in
place beside a scorer, or base + adapters); the CLI prints it and refuses a run that does not fit
before anything starts. Pure arithmetic: no GPU needed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from optima_env.errors import ConfigError
from optima_trainers import resolve_config
from optima_trainers.run.memory_plan import ModelShape, plan_memory, plan_run
from tests.docs import DOCS, text

LLAMA3_8B = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
    "tie_word_embeddings": False, "model_type": "llama",
}  # fmt: skip
"""Meta-Llama-3-8B-Instruct's config.json fields that size it."""
SHAPE = ModelShape.from_config(LLAMA3_8B)
IN_PLACE = {"generation.vllm_weights": "in_place"}
"""The design before base + adapters: weights reloaded in place, a separate readability model."""


def config(trainer: str = "idpo", profile: str = "paper", **sets):
    overrides = {"generation.backend": "vllm", **sets}
    return resolve_config("ie/hotpotqa-v0", trainer, profile=profile, device="cuda", overrides=overrides)


def parts(plan, phase: str) -> dict[str, float]:
    (found,) = [p for p in plan.phases if p.name == phase]
    return {name: round(gb, 2) for name, gb in found.parts}


def test_the_sizes_are_the_readmes_arithmetic_for_llama_3_8b() -> None:
    """W, L, A, G, R and F of the GPU guide's "The device check" (GB = 10^9 bytes)."""
    assert SHAPE.params == 8_030_261_248 and SHAPE.lora_params(16) == 41_943_040
    assert SHAPE.activation_values == 83_968
    plan = plan_memory(config(), SHAPE, 80e9)
    sft = parts(plan, "sft")  # 1 x 2,048 tokens, checkpointing (on with a GPU)
    assert (sft["weights"], sft["LoRA state"], sft["activations"], sft["logits"]) == (16.06, 0.67, 0.88, 2.63)
    dpo = parts(plan, "dpo")  # both sides of a 2 x 4,096-token pair (the spec's longest)
    assert (dpo["activations"], dpo["logits"]) == (3.52, 10.51)
    assert (
        parts(plan_memory(config(**IN_PLACE), SHAPE, 80e9), "score")["scorer"] == 16.75
    )  # W + R = 16.06 + 0.69
    full = parts(plan_memory(config("isft", "paper-full"), SHAPE, 80e9), "sft")
    assert full["weights"] + full["gradients and Adam"] == pytest.approx(128.48, abs=0.01)  # F


@pytest.mark.parametrize(("card", "fitted"), [(80e9, 0.78), (141e9, 0.87)])
def test_in_place_the_default_utilization_leaves_no_room_for_the_tree_stages_scorer_and_is_lowered(
    card, fitted
) -> None:
    """With weights in place, at the default 0.9 the tree stage's engine and scorer do not fit
    together (nor at the 0.85 the README used to give); the plan lowers the default to the highest
    value that fits."""
    for util in (0.9, 0.85):
        plan = plan_memory(
            config(**IN_PLACE, **{"generation.vllm_gpu_memory_utilization": util}), SHAPE, card
        )
        assert [p.name for p in plan.failing()] == ([] if (card, util) == (141e9, 0.85) else ["tree"])
        assert plan.max_utilization == fitted
    plan = plan_memory(config(**IN_PLACE), SHAPE, card)
    (tree,) = plan.failing()
    assert tree.line().endswith(f"set generation.vllm_gpu_memory_utilization <= {fitted:.2f}")
    lowered = plan.fitted(config(**IN_PLACE))
    assert lowered.generation.vllm_gpu_memory_utilization == fitted
    assert plan_memory(lowered, SHAPE, card).failing() == []
    explicit = config(**IN_PLACE, **{"generation.vllm_gpu_memory_utilization": 0.85})
    assert plan_memory(explicit, SHAPE, card).fitted(explicit) is explicit  # a value the user chose stays


def test_a_run_without_tree_stages_keeps_the_default() -> None:
    for card in (80e9, 141e9):
        plan = plan_memory(config("isft"), SHAPE, card)
        assert plan.failing() == [] and [p.name for p in plan.phases if p.name in ("tree", "dpo")] == []
        assert plan.fitted(config("isft")).generation.vllm_gpu_memory_utilization == 0.9


def test_full_fine_tuning_fits_one_141_gb_card_or_eight_sharded_80_gb_cards() -> None:
    full = config("isft", "paper-full")
    (sft,) = plan_memory(full, SHAPE, 80e9).failing()
    assert sft.name == "sft" and "deepspeed_zero3.yaml" in sft.fix
    assert plan_memory(full, SHAPE, 141e9).failing() == []
    ddp = plan_memory(full, SHAPE, 80e9, world=8)  # DDP: a full copy on each GPU
    assert [p.name for p in ddp.failing()] == ["sft"]
    for zero, expected in ((2, 30.11), (3, 16.06)):
        plan = plan_memory(full, SHAPE, 80e9, world=8, zero_stage=zero)
        assert plan.failing() == []
        sft_parts = parts(plan, "sft")
        assert round(sft_parts["weights"] + sft_parts["gradients and Adam"], 2) == expected


def test_the_check_names_each_phase_that_does_not_fit_with_its_fix() -> None:
    plan = plan_memory(config(**IN_PLACE, **{"generation.vllm_gpu_memory_utilization": 0.85}), SHAPE, 80e9)
    with pytest.raises(ConfigError) as caught:
        plan.check()
    message = str(caught.value)
    assert "the run does not fit a GPU of 80.0 GB" in message
    assert re.search(r"tree short by 5\.25 GB: set generation\.vllm_gpu_memory_utilization <= 0\.78", message)
    assert "sft" not in message and "score" not in message


def test_the_cli_prints_the_plan_and_refuses_a_run_that_does_not_fit(tmp_path: Path, capsys) -> None:
    """``--print-config --plan-gpu-gb`` plans for a card this machine lacks (with a GPU's defaults)
    and prints the fitted config; a run that cannot fit is refused before its folder exists."""
    from optima_trainers.cli.train import main

    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA3_8B), encoding="utf-8")
    for name in ("model.safetensors.index.json", "tokenizer_config.json"):  # a downloaded 8B's file names
        (model / name).write_text("{}", encoding="utf-8")  # (the plan reads config.json alone)
    argv = ["--task", "hotpotqa", "--trainer", "idpo", "--profile", "paper", "--backend", "vllm",
            "--model", str(model), "--plan-gpu-gb", "80", "--print-config"]  # fmt: skip
    assert main(argv) == 0  # base + adapters, the default with a GPU: the default utilization fits
    out, err = capsys.readouterr()
    assert json.loads(out)["generation"]["vllm_gpu_memory_utilization"] == 0.9
    assert (
        "memory plan (adapters), one GPU of 80.0 GB at vllm_gpu_memory_utilization 0.90 (at most 0.96 fits)"
        in err
    )
    assert main([*argv, "--set", "generation.vllm_weights=in_place"]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert printed["dtype"] == "bfloat16" and printed["generation"]["vllm_gpu_memory_utilization"] == 0.78
    assert (
        "memory plan (in_place), one GPU of 80.0 GB at vllm_gpu_memory_utilization 0.78 (at most 0.78 fits)"
        in err
    )
    assert "tree: CUDA context 0.50 + engine 62.40 + scorer 16.75 = 79.65 of 80.00 GB, fits" in err
    run = tmp_path / "run"
    small = ["--task", "synth", "--trainer", "idpo", "--backend", "vllm", "--plan-gpu-gb", "2",
             "--run-dir", str(run)]  # fmt: skip
    assert main(small) == 2
    assert "error: the run does not fit a GPU of 2.0 GB" in capsys.readouterr().err
    assert not run.exists()


def test_no_plan_for_other_backends_or_without_a_gpu() -> None:
    hf = resolve_config("ie/synth-v0", "idpo", device="cpu")
    assert plan_run(hf, 80e9) == (hf, None)
    vllm = resolve_config("ie/synth-v0", "idpo", device="cpu", overrides={"generation.backend": "vllm"})
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        assert plan_run(vllm) == (vllm, None)


@pytest.mark.parametrize(
    ("marker", "cfg", "kwargs"),
    [("one-gpu", lambda: config(), {}),
     ("one-gpu-in-place", lambda: config(**IN_PLACE), {}),
     ("zero3", lambda: config("isft", "paper-full"), {"world": 8, "zero_stage": 3})],
)  # fmt: skip
def test_the_gpu_guide_quotes_the_plan_of_its_gpu_commands(marker, cfg, kwargs) -> None:
    page = text(DOCS / "guides" / "gpus.md")
    block = page.split(f"<!-- memory-plan:{marker} -->\n```text\n", 1)[1].split("```", 1)[0]
    resolved = cfg()
    plan = plan_memory(resolved, SHAPE, 80e9, **kwargs)
    fitted = plan.fitted(resolved)
    assert block.splitlines() == plan_memory(fitted, SHAPE, 80e9, **kwargs).lines()


@pytest.mark.parametrize(("card", "most"), [(80e9, 0.96), (141e9, 0.97)])
def test_base_and_adapters_hold_no_scorer_and_fit_at_the_default_utilization(card, most) -> None:
    """The default on a GPU with LoRA training: the engine scores, so no phase holds a scorer; the
    tree stage keeps only the longest scored turn's logits beside the engine, and 0.9 fits."""
    plan = plan_memory(config(), SHAPE, card)
    assert plan.weights == "adapters" and plan.failing() == [] and plan.max_utilization == most
    assert all("scorer" not in dict(p.parts) for p in plan.phases)
    assert parts(plan, "tree")["prompt_logprobs logits"] == 2.57  # 2,000 tokens x 128,256 x 10 B
    assert plan.fitted(config()).generation.vllm_gpu_memory_utilization == 0.9


def test_the_lora_slots_come_out_of_the_engines_kv_cache() -> None:
    """Two slots at the run's last stage's rank, rounded up to a rank vLLM accepts (bf16)."""
    from optima_env.backends.vllm_lora import lora_slot_rank
    from optima_trainers.config.sections import lora_stage_rank

    def kv(plan) -> float:
        return next(p.limit_gb for p in plan.phases if p.name == "engine KV cache")

    at = {"generation.vllm_gpu_memory_utilization": 0.78}
    adapters, in_place = (
        plan_memory(config(**at), SHAPE, 80e9),
        plan_memory(config(**IN_PLACE, **at), SHAPE, 80e9),
    )
    slots = 2 * SHAPE.lora_params(lora_slot_rank(lora_stage_rank(config()))) * 2 / 1e9
    assert kv(adapters) == pytest.approx(kv(in_place) - slots)


def test_full_fine_tuning_dpo_holds_a_reference_copy_only_without_precomputed_log_probs() -> None:
    precomputed = plan_memory(config("isft-dpo", "paper-full"), SHAPE, 141e9)
    assert "reference" not in parts(precomputed, "dpo")
    per_step = config("isft-dpo", "paper-full", **{"dpo.precompute_ref_log_probs": False})
    assert parts(plan_memory(per_step, SHAPE, 141e9), "dpo")["reference"] == 16.06
