"""The run folder and its checkpoints (no model needed): a checkpoint is written atomically, its
manifest is verified before every load, and a run folder reopens, refuses conflicts and adopts
another run's finished stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from optima_env.errors import DataError, OptimaError, TaskContractError
from optima_trainers.config.train import resolve_config
from optima_trainers.run.checkpoint import (
    COMPLETE_MARKER,
    CorruptCheckpointError,
    TrainResult,
    atomic_checkpoint,
    discard_partial,
    is_complete,
    require_complete,
)
from optima_trainers.run.folder import RunDir


def test_atomic_checkpoint_appears_complete_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    with pytest.raises(RuntimeError), atomic_checkpoint(target) as (tmp, finish):
        (tmp / "model.safetensors").write_text("half")
        raise RuntimeError("killed while saving")
    assert not target.exists() and not list(tmp_path.iterdir())
    result = TrainResult(checkpoint=str(target), train_loss=0.5, steps=2, num_examples=4, metrics={"x": 1.0})
    with atomic_checkpoint(target) as (tmp, finish):
        (tmp / "model.safetensors").write_text("whole")
        finish(result)
    assert is_complete(target) and require_complete(target) == result


def test_partial_checkpoint_is_never_loaded(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "model.safetensors").write_text("half")
    assert not is_complete(target)
    with pytest.raises(DataError, match="not a complete checkpoint"):
        require_complete(target)
    assert discard_partial(target) and not target.exists()


def _finished_checkpoint(target: Path) -> TrainResult:
    result = TrainResult(checkpoint=str(target), train_loss=0.5, steps=2, num_examples=4)
    with atomic_checkpoint(target) as (tmp, finish):
        (tmp / "model.safetensors").write_bytes(b"w" * 1000)
        (tmp / "tok").mkdir()
        (tmp / "tok" / "tokenizer.json").write_text("{}")
        finish(result)
    return result


def test_complete_marker_is_a_manifest_of_every_file(tmp_path: Path) -> None:
    import hashlib
    import json

    target = tmp_path / "ckpt"
    result = _finished_checkpoint(target)
    marker = json.loads((target / COMPLETE_MARKER).read_text(encoding="utf-8"))
    assert TrainResult.from_dict(marker) == result
    assert marker["files"] == {
        "model.safetensors": {"size": 1000, "sha256": hashlib.sha256(b"w" * 1000).hexdigest()},
        "tok/tokenizer.json": {"size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()},
    }
    assert require_complete(target) == result


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda t: (t / "model.safetensors").write_bytes(b"w" * 500), r"500 bytes, but 1000 .*truncated"),
        (lambda t: (t / "model.safetensors").write_bytes(b"x" * 1000), "sha256 differs"),
        (lambda t: (t / "tok" / "tokenizer.json").unlink(), "listed in .* but missing"),
        (lambda t: (t / COMPLETE_MARKER).write_bytes(b'{"checkpoint": "x", "train_lo'), "corrupt marker"),
        (lambda t: (t / COMPLETE_MARKER).write_bytes(b"\xff\xfe{}"), "corrupt marker"),
        (lambda t: (t / COMPLETE_MARKER).write_text('{"files": []}'), "field 'files'"),
        (lambda t: (t / COMPLETE_MARKER).write_text('{"files": {}}'), "not a training summary"),
    ],
)
def test_corrupt_checkpoint_is_detected_and_never_loaded(tmp_path: Path, damage, message: str) -> None:
    target = tmp_path / "ckpt"
    _finished_checkpoint(target)
    damage(target)
    assert is_complete(target)  # the writer finished: not a partial checkpoint ...
    with pytest.raises(CorruptCheckpointError, match=message) as info:
        require_complete(target)  # ... but it fails verification, loudly
    assert str(target) in str(info.value) and "delete the folder" in str(info.value)
    assert isinstance(info.value, DataError) and isinstance(info.value, OptimaError)
    assert not discard_partial(target) and target.exists()  # evidence is never deleted silently


@pytest.mark.parametrize(
    ("damage", "path", "found"),
    [
        (lambda c: c.update(tree={**c["tree"], "reward": {}}), "config.json", "field 'tree.reward'"),
        (
            lambda c: c.update(generation={**c["generation"], "compute_type": "int8"}),
            "config.json",
            "field 'generation.compute_type'",
        ),
        ("marker without files", "iter_00/checkpoint/COMPLETE", "no 'files' manifest"),
        ("marker without history", "iter_00/checkpoint/COMPLETE", "no training 'history'"),
        ("several trees a line", "iter_01/trees.jsonl", "the line of chunk 0 holds 2 trees"),
    ],
)
def test_an_old_run_folder_gets_one_line_naming_its_format(
    tmp_path: Path, damage, path: str, found: str
) -> None:
    """A file of run folder format 1 is refused with one line: the file, what marks it, its format,
    and what to do."""
    import json

    from optima_trainers.generation.tree_stage import finished_trees

    run = RunDir.create(resolve_config("ie/synth-v0", "idpo"), run_dir=tmp_path / "run")
    target = run.root / path
    if callable(damage):
        stored = json.loads(target.read_text(encoding="utf-8"))
        damage(stored)
        target.write_text(json.dumps(stored), encoding="utf-8")
        read = lambda: RunDir.open(run.root)  # noqa: E731
    elif damage == "several trees a line":
        run.stage("iter_01")
        target.write_text(json.dumps({"chunk": 0, "trees": [{}, {}]}) + "\n", encoding="utf-8")
        read = lambda: finished_trees(target)  # noqa: E731
    else:
        result = _finished_checkpoint(target.parent)
        marker = {**result.to_dict(), "files": {}}
        del marker["files" if damage == "marker without files" else "history"]
        target.write_text(json.dumps(marker), encoding="utf-8")
        read = lambda: require_complete(target.parent)  # noqa: E731
    with pytest.raises(DataError) as info:
        read()
    message = str(info.value)
    assert message == (
        f"{target}: {found}: run folder format 1, this optima_trainers reads format 3 only; finish "
        "that run with the optima_trainers release that began it, or start a new run folder"
    )
    assert "\n" not in message


def test_resume_refuses_a_corrupt_checkpoint_before_loading_it(tmp_path: Path) -> None:
    """A finished stage whose checkpoint was truncated afterwards stops the resumed run with the fix."""
    import json

    from optima_trainers.host.loop import IterativeTrainer

    config = resolve_config("ie/synth-v0", "isft", iterations=2, model=str(tmp_path / "base"))
    run = RunDir.create(config, run_dir=tmp_path / "run")
    checkpoint = run.stage("iter_00") / "checkpoint"
    _finished_checkpoint(checkpoint)
    record = {"model": "iter_00/checkpoint", "cursor_end": 3, "metrics": {"iteration": 0.0}}
    (run.root / "iter_00" / "result.json").write_text(json.dumps(record), encoding="utf-8")
    (checkpoint / "model.safetensors").write_bytes(b"w" * 10)  # e.g. a full disk after the fact
    trainer = IterativeTrainer(config, run_dir=run, progress=False)
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors: 10 bytes.*delete the folder"):
        trainer.run()
    assert not (run.root / "iter_01").exists()  # nothing was generated from the corrupt model


def test_open_or_create_reopens_a_run_of_the_same_settings_and_names_each_conflict(tmp_path: Path) -> None:
    from optima_env.configtree import ConfigError

    config = resolve_config("ie/synth-v0", "idpo", seed=3)
    created = RunDir.open_or_create(config, tmp_path / "run")
    assert (created.root / "config.json").is_file()
    longer = config.replace(iterations=config.iterations + 2)  # a resumed run may run longer
    assert RunDir.open_or_create(longer, tmp_path / "run").root == created.root
    other = config.replace(seed=4, **{"dpo.beta": 0.3})
    assert config.resume_conflicts(other) == {"dpo.beta": (0.1, 0.3), "seed": (3, 4)}
    with pytest.raises(ConfigError, match=r"'dpo\.beta': \(0\.1, 0\.3\), 'seed': \(3, 4\)"):
        RunDir.open_or_create(other, tmp_path / "run")


def test_adopt_stage_takes_another_runs_finished_stage_whole_and_says_where_from(tmp_path: Path) -> None:
    from optima_env.io import write_json_atomic
    from optima_trainers.run.folder import read_stage_result

    config = resolve_config("ie/synth-v0", "isft", seed=3)
    source = RunDir.create(config, run_dir=tmp_path / "isft")
    (source.stage("iter_00") / "checkpoint").mkdir()
    (source.stage("iter_00") / "checkpoint" / "weights.bin").write_bytes(b"w" * 64)
    (source.stage("iter_00") / "scored.jsonl").write_text('{"x": 1}\n')
    target = RunDir.create(config.replace(trainer="idpo"), run_dir=tmp_path / "idpo")
    with pytest.raises(TaskContractError, match="not a finished stage"):
        target.adopt_stage("iter_00", source, "iter_00")
    record = {"model": "iter_00/checkpoint", "cursor_end": 4, "metrics": {"iteration": 0.0}, "history": []}
    write_json_atomic(source.stage("iter_00") / "result.json", record)
    (target.stage("iter_00") / "episodes.jsonl").write_text("unfinished\n")  # its own unfinished try
    target.adopt_stage("iter_00", source, "iter_00")
    adopted = target.root / "iter_00"
    assert not (adopted / "episodes.jsonl").exists() and (adopted / "scored.jsonl").read_text() == '{"x": 1}\n'
    assert (adopted / "checkpoint" / "weights.bin").stat().st_ino == (
        source.root / "iter_00" / "checkpoint" / "weights.bin"
    ).stat().st_ino  # a hard link, not a copy
    assert read_stage_result(adopted / "result.json")["model"] == "iter_00/checkpoint"
    assert read_stage_result(source.root / "iter_00" / "result.json") == record  # the source is untouched
    assert target.adopted_from("iter_00") == str(source.root / "iter_00") and source.adopted_from("iter_00") is None
    with pytest.raises(TaskContractError, match="has finished already"):
        target.adopt_stage("iter_00", source, "iter_00")
    assert not list(target.root.glob(".*adopting"))
