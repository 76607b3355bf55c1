"""The demo's training side on the tiny model: whichever run reaches M_0 first trains it, the others
adopt it, and M_0's row (the control) is that run's (benchmarks.demo.train, benchmarks.demo.control)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from benchmarks.demo.control import control_label
from benchmarks.demo.suite import row_labels
from benchmarks.demo.tasks import DemoTask
from benchmarks.demo.train import chain_rank, init_done, init_result, train_run
from optima_env.errors import DataError
from optima_trainers.run.checkpoint import manifest_entries
from tests.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow  # runs a real model: the full suite only

SMALL = {
    "generation.instances": 2, "generation.num_samples": 2, "generation.max_turns": 2,
    "generation.max_new_tokens": 8, "generation.concurrency": 4, "generation.backend": "hf",
    "selection.theta": -100.0, "sft.max_steps": 1, "dpo.max_steps": 1,
    "tree.instances": 1, "tree.selections": 2, "tree.rollouts": 1, "tree.normalizer_instances": 1,
}  # fmt: skip


def test_the_run_that_trains_m0_first_shares_it_and_owns_the_control_row(tmp_path: Path) -> None:
    tiny = make_tiny_model(tmp_path / "tiny")
    spec = DemoTask(
        name="synth", task="ie/synth-v0", model=str(tiny), trainers=("isft", "idpo"), train=SMALL,
        train_by_trainer={"isft": {"iterations": 2}, "idpo": {"iterations": 1, "tree.pair_task_credit": True}},
    )  # fmt: skip
    root = tmp_path / "synth"
    idpo = train_run(spec, root, "idpo", progress=False)  # reaches M_0 first: trains it
    isft = train_run(spec, root, "isft", progress=False)  # same initialization settings: adopts it
    assert idpo.shared is None and isft.shared == "iter_00"
    assert init_done(spec, root, "idpo") and init_done(spec, root, "isft")
    # what train_one --after waits for: the init stage's record, resolved once
    assert init_result(spec, root, "idpo") == root / "train" / "idpo" / "iter_00" / "result.json"
    own, adopted = root / "train" / "idpo" / "iter_00", root / "train" / "isft" / "iter_00"
    assert (adopted / "adopted.json").is_file() and not (own / "adopted.json").is_file()
    assert manifest_entries(adopted / "checkpoint") == manifest_entries(own / "checkpoint")
    runs = [isft, idpo]  # the demo's table order
    assert control_label(runs) == "iDPO iter 00"
    labels = row_labels(runs)
    assert labels["isft", "iter_00"] == labels["idpo", "iter_00"] == "iDPO iter 00"
    assert labels["isft", "iter_01"] == "iSFT iter 01"
    # the final change's rank: the sum of the stages' LoRA ranks; iDPO's tree found no pair on the
    # tiny model, so its stage kept M_0's checkpoint, which is counted once
    assert chain_rank(isft) == 32
    assert idpo.stages[1][1] == idpo.stages[0][1] and chain_rank(idpo) == 16
    adapter = root / "train" / "isft" / "iter_01" / "checkpoint" / "adapter" / "adapter_config.json"
    adapter.rename(adapter.with_suffix(".gone"))
    with pytest.raises(DataError, match=r"isft iter_01: expected the stage's LoRA adapter .*adapter_rank"):
        chain_rank(isft)
    # a third run with other initialization settings trains its own M_0
    other = DemoTask(
        name="synth", task="ie/synth-v0", model=str(tiny), trainers=("isft", "idpo", "isft-dpo"),
        train=SMALL, train_by_trainer={"isft-dpo": {"iterations": 1, "sft.learning_rate": 1e-3}},
    )  # fmt: skip
    assert train_run(other, root, "isft-dpo", progress=False).shared is None


def test_train_one_says_what_it_expected(capsys) -> None:
    from benchmarks.demo.train_one import main

    assert main(["nope", "idpo"]) == 2 and "no demo task 'nope'; expected one of synth" in capsys.readouterr().err
    assert main(["synth", "grpo"]) == 2 and "synth trains isft, idpo, isft-dpo; got 'grpo'" in capsys.readouterr().err
    assert main(["synth", "idpo", "--after", "x"]) == 2 and "got 'x'" in capsys.readouterr().err
    assert main(["synth", "idpo", "--threads", "0"]) == 2
    assert "--threads must be at least 1, got 0" in capsys.readouterr().err
