"""DPO/RPO training on TRL: the loss composition, the atomic merged save, and a real run."""

from __future__ import annotations

import json
import logging
import math

import pytest

from optima_env.errors import DataError, TaskContractError
from optima_trainers.run.checkpoint import COMPLETE_MARKER, is_complete, require_complete
from optima_trainers.run.records import PreferencePair

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("peft")

from optima_trainers.config.training import DPOTrainConfig  # noqa: E402
from optima_trainers.dpo.trainer import LOG_FILE, dpo_args, train_dpo  # noqa: E402


def make_pairs(n: int) -> list[PreferencePair]:
    facts = ["Ann lives in Paris.", "Bo works for Acme.", "Cy likes tea.", "Di owns a boat."]
    return [
        PreferencePair(
            prompt=(
                {"role": "system", "content": f"You are Bob. Question {i}: where does Ann live?"},
                {"role": "assistant", "content": f"Alice: {facts[i % len(facts)]}"},
            ),
            chosen="Bob: <A>Paris</A>",
            rejected=f"Bob: I do not know, maybe it is somewhere far away, number {i}.",
            chosen_value=0.9,
            rejected_value=0.1,
            task_id="test/tiny-v0",
            sample_id=f"tiny-{i}",
            instance_index=i,
            depth=1,
            agent="Bob",
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer random Llama with the embedded model's tokenizer and chat template."""
    from tests.tiny_model import make_tiny_model

    folder = tmp_path_factory.mktemp("tiny") / "start"
    return make_tiny_model(folder, tie_word_embeddings=False, max_position_embeddings=512)


def first_losses(checkpoint) -> list[float]:
    history = json.loads((checkpoint / LOG_FILE).read_text())
    return [h["loss"] for h in history if "loss" in h]


def weights(folder) -> dict[str, object]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_rpo_is_dpo_plus_the_chosen_nll() -> None:
    rpo = dpo_args(DPOTrainConfig(rpo_alpha=1.0), output_dir="unused")
    plain = dpo_args(DPOTrainConfig(rpo_alpha=None), output_dir="unused")
    assert (rpo.loss_type, rpo.loss_weights) == (["sigmoid", "sft"], [1.0, 1.0])
    assert plain.loss_type == ["sigmoid"]
    assert rpo.bf16 is False and rpo.gradient_checkpointing is False
    # held-out pairs are evaluated one a batch, so the logged accuracy is k/n (TRL averages the
    # batches' means: batches of 2 over 11 pairs would log 0.5833)
    assert dpo_args(DPOTrainConfig(per_device_batch_size=4), output_dir="x").per_device_eval_batch_size == 1
    assert (
        dpo_args(
            DPOTrainConfig(batch_size=64, per_device_batch_size=8), output_dir="x"
        ).gradient_accumulation_steps
        == 8
    )
    with pytest.raises(TaskContractError, match="beta"):
        DPOTrainConfig(beta=0)


@pytest.mark.slow
def test_lora_dpo_saves_a_merged_model_atomically(tiny_model_dir, tmp_path) -> None:
    out = tmp_path / "iter-1"
    out.mkdir()
    (out / "model.safetensors").write_text("half-written")  # a killed save: no marker, so it is redone
    config = DPOTrainConfig.cpu(learning_rate=1e-3, rpo_alpha=1.0, max_length=256)
    result = train_dpo(model_path=str(tiny_model_dir), pairs=make_pairs(5), config=config, output_dir=out)
    assert is_complete(out) and require_complete(out) == result
    assert result.num_examples == 4 and result.steps == 2  # 90% of 5 pairs, batch 2
    assert math.isfinite(result.train_loss) and result.metrics["num_dropped"] == 0
    # the reference is the start (adapter disabled), so the first DPO term is exactly log 2 and
    # the first RPO loss adds the chosen NLL of a random model (about log |vocab|)
    assert first_losses(out)[0] > math.log(2) + 5
    before, after = weights(tiny_model_dir), weights(out)
    assert set(before) == set(after)  # merged: plain weights, no LoRA keys
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any("q_proj" in k for k in changed) and any("mlp.down_proj" in k for k in changed)
    assert "model.embed_tokens.weight" not in changed
    with pytest.raises(DataError, match="already holds a complete checkpoint"):
        train_dpo(model_path=str(tiny_model_dir), pairs=make_pairs(5), config=config, output_dir=out)
    assert not list(tmp_path.glob(".iter-1.tmp-*"))


@pytest.mark.slow
def test_plain_dpo_starts_at_log_two(tiny_model_dir, tmp_path) -> None:
    config = DPOTrainConfig.cpu(learning_rate=1e-3, rpo_alpha=None, max_length=256)
    out = tmp_path / "plain"
    result = train_dpo(model_path=str(tiny_model_dir), pairs=make_pairs(3), config=config, output_dir=out)
    assert first_losses(out)[0] == pytest.approx(math.log(2), abs=1e-4)
    # plain DPO: the loss is the DPO part; the chosen NLL is logged, not trained on
    for h in (h for h in result.history if "loss" in h):
        assert h["loss/dpo"] == pytest.approx(h["loss"], rel=1e-5) and h["loss/nll"] > 5


def test_overlong_prompts_are_dropped_and_counted(tiny_model_dir, tmp_path) -> None:
    config = DPOTrainConfig.cpu(max_length=10)
    with pytest.raises(DataError, match="max_length"):
        train_dpo(
            model_path=str(tiny_model_dir), pairs=make_pairs(3), config=config, output_dir=tmp_path / "x"
        )
    assert not (tmp_path / "x").exists()
    with pytest.raises(DataError, match="no preference pairs"):
        train_dpo(model_path=str(tiny_model_dir), pairs=[], config=config, output_dir=tmp_path / "x")


@pytest.mark.slow
def test_one_rpo_iteration_on_the_embedded_model_changes_the_weights(embedded, tmp_path) -> None:
    from optima_env.models import resolve_model_path

    config = DPOTrainConfig.cpu(rpo_alpha=1.0, max_length=256, batch_size=2, per_device_batch_size=2)
    out = tmp_path / "idpo-1"
    result = train_dpo(model_path="embedded", pairs=make_pairs(5), config=config, output_dir=out)
    assert result.steps == 2 and math.isfinite(result.train_loss)
    losses = first_losses(out)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert losses[0] > math.log(2)  # DPO term log 2 at the start, plus the chosen NLL
    before = embedded[0].state_dict()
    after = weights(out)
    changed = [k for k in before if not torch.equal(before[k].cpu(), after[k])]
    assert any("self_attn.q_proj" in k for k in changed)
    assert (out / COMPLETE_MARKER).is_file() and resolve_model_path("embedded") != str(out)


@pytest.mark.slow
def test_every_step_and_the_held_out_pairs_are_recorded_and_read_back(tiny_model_dir, tmp_path) -> None:
    from optima_trainers.dpo.metrics import DPO_METRICS

    config = DPOTrainConfig.cpu(learning_rate=1e-3, rpo_alpha=1.0, max_length=256, epochs=2.0)
    out = tmp_path / "watched"
    result = train_dpo(
        model_path=str(tiny_model_dir),
        pairs=make_pairs(10),
        config=config,
        output_dir=out,
        report_to="tensorboard",
        trainer_dir=tmp_path / "trainer",
    )
    record = require_complete(out)  # read back from the checkpoint's record
    assert record == result and result.num_examples == 9 and result.steps == 10  # 5 steps (batch 2) x 2
    steps = [h for h in record.history if "loss" in h]
    assert [h["step"] for h in steps] == list(range(1, 11))
    for h in steps:
        assert all(math.isfinite(h[m]) for m in DPO_METRICS)
        assert h["loss"] == pytest.approx(h["loss/dpo"] + 1.0 * h["loss/nll"], rel=1e-4)
    # the reference is the start: the first DPO term is log 2, its margin 0; the NLL that of a random model
    assert steps[0]["loss/dpo"] == pytest.approx(math.log(2), abs=1e-4)
    assert steps[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5) and steps[0]["loss/nll"] > 5
    assert steps[-1]["loss/nll"] < steps[0]["loss/nll"] and steps[-1]["rewards/margins"] > 0
    evals = [h for h in record.history if "eval_loss" in h]  # the held-out pair, after each epoch
    assert [h["epoch"] for h in evals] == [1.0, 2.0]
    for h in evals:
        assert h["eval_loss"] == pytest.approx(h["eval_loss/dpo"] + h["eval_loss/nll"], rel=1e-4)
        assert h["eval_rewards/accuracies"] in (0.0, 1.0)  # one held-out pair
    metrics = record.metrics
    assert metrics["eval_pairs"] == 1
    for m in DPO_METRICS:
        assert metrics[f"eval_{m}"] == evals[-1][f"eval_{m}"]
        assert metrics[f"epoch_1/eval_{m}"] == evals[0][f"eval_{m}"]
        for epoch, window in ((1, steps[:5]), (2, steps[5:])):
            assert metrics[f"epoch_{epoch}/{m}"] == pytest.approx(sum(h[m] for h in window) / 5)
    # through the tracker: TRL sent every step, with the loss's parts, to tensorboard
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list((tmp_path / "trainer").rglob("events.out.tfevents.*"))
    tags = set()
    for path in events:
        accumulator = EventAccumulator(str(path))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    assert {"train/loss/dpo", "train/loss/nll", "train/rewards/margins", "eval/rewards/accuracies"} <= tags


@pytest.mark.slow
@pytest.mark.parametrize("lora", [True, False])
def test_reference_log_probs_computed_once_train_as_those_of_every_step(
    tiny_model_dir, tmp_path, caplog, lora
) -> None:
    """The pairs are fixed before a stage trains: TRL's reference log-probs computed once before
    the first step (``dpo.precompute_ref_log_probs``; with LoRA the adapter disabled, in full
    fine-tuning the start, of which no copy is then kept) give the steps, the held-out evaluations
    and the weights of one reference pass per step."""
    from optima_trainers.dpo.metrics import DPO_METRICS

    runs = {}
    for once in (False, True):
        config = DPOTrainConfig.cpu(
            learning_rate=1e-3,
            rpo_alpha=1.0,
            max_length=256,
            epochs=2.0,
            lora=lora,
            precompute_ref_log_probs=once,
        )
        assert dpo_args(config, output_dir="x").precompute_ref_log_probs is once  # reaches TRL's DPOConfig
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="optima_trainers.dpo.metrics"):
            runs[once] = train_dpo(model_path=str(tiny_model_dir), pairs=make_pairs(10), config=config,
                                   output_dir=tmp_path / f"out-{once}")  # fmt: skip
        # TRL's trainer took the setting: 9 training pairs and 1 held out computed before the first step
        assert [r.getMessage() for r in caplog.records if "reference log-probs" in r.getMessage()] == (
            [f"reference log-probs of the {n} {split} pairs computed before training"
             for n, split in ((9, "train"), (1, "eval"))] if once else []
        )  # fmt: skip
    every_step, once = runs[False], runs[True]
    steps = [[h for h in r.history if "loss" in h or "eval_loss" in h] for r in (every_step, once)]
    assert len(steps[0]) == len(steps[1]) == 12  # 10 steps and 2 evaluations
    for a, b in zip(*steps, strict=True):
        assert a["step"] == b["step"]
        for m in (*DPO_METRICS, *(f"eval_{m}" for m in DPO_METRICS)):
            if m in a:
                assert b[m] == pytest.approx(a[m], rel=1e-4, abs=1e-5), (a["step"], m)
    # the policy moved away from the reference, which stayed the start in both
    assert steps[1][-2]["rewards/margins"] > 0.1
    before, after = weights(tmp_path / "out-False"), weights(tmp_path / "out-True")
    assert all(torch.allclose(before[k], after[k], atol=1e-5) for k in before)


def test_the_reference_setting_reaches_the_stage_from_the_command_line(capsys) -> None:
    from optima_trainers.cli.train import main

    for value in (True, False):
        assert main(["--task", "synth", "--trainer", "idpo", "--profile", "cpu", "--print-config",
                     "--set", f"dpo.precompute_ref_log_probs={str(value).lower()}"]) == 0  # fmt: skip
        config = json.loads(capsys.readouterr().out)
        assert config["dpo"]["precompute_ref_log_probs"] is value
        assert dpo_args(DPOTrainConfig(**config["dpo"]), output_dir="x").precompute_ref_log_probs is value


def test_the_dpo_metrics_doctests_pass() -> None:
    import doctest

    from optima_trainers.dpo import metrics as dpo_metrics

    result = doctest.testmod(dpo_metrics)
    assert result.attempted and result.failed == 0
