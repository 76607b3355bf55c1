"""Rerunning a command with the same --out resumes: finished units are not generated again."""

from __future__ import annotations

import json

import pytest

import benchmarks.evaluation.units as bench_units
from benchmarks.evaluation.policies import ReaderPolicy
from benchmarks.run import RunConfigError
from optima_env.io import read_episodes

FLAGS = ("--suite", "smoke", "--model", "scripted", "--methods", "cot,sc,mad", "--sc-n", "3")
FLAGS += ("--episodes", "3")


@pytest.fixture
def policies(monkeypatch):
    """Every policy the runner loads, so tests can count generate calls."""
    loaded: list[ReaderPolicy] = []
    original = bench_units.load_policy

    def load(model, **kwargs):
        policy, tokenizer = original(model, **kwargs)
        loaded.append(policy)
        return policy, tokenizer

    monkeypatch.setattr(bench_units, "load_policy", load)
    return loaded


def _lines(path) -> list[str]:
    return [line for line in path.read_text().split("\n") if line.strip()]


def test_second_run_generates_nothing_and_reports_the_same(bench, policies) -> None:
    first, out = bench(*FLAGS)
    assert first["units"] == {"generated": 3 + 9 + 3, "resumed": 0}
    assert sum(p.calls for p in policies) > 0
    before = _lines(out / "episodes.jsonl")
    policies.clear()

    second, _ = bench(*FLAGS)
    assert second["units"] == {"generated": 0, "resumed": 15}
    assert policies == []  # no model was even loaded
    assert _lines(out / "episodes.jsonl") == before
    assert second["rows"] == first["rows"]
    assert [i["generated"] for i in second["invocations"]] == [15, 0]  # the history is kept
    assert "over 2 invocations" in (out / "report.md").read_text()


def test_a_torn_last_line_is_regenerated_and_repaired(bench, policies) -> None:
    first, out = bench(*FLAGS)
    path = out / "episodes.jsonl"
    lines = _lines(path)
    torn = json.loads(lines[-1])["metadata"]
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])  # a crash mid-append

    second, _ = bench(*FLAGS)
    assert second["units"] == {"generated": 1, "resumed": 14}
    episodes = read_episodes(path)
    assert len(episodes) == 15 and len(_lines(path)) == 15
    redone = [e for e in episodes if e.metadata["method"] == torn["method"]]
    assert any(e.metadata["instance"] == torn["instance"] for e in redone)
    assert second["rows"] == first["rows"]


def test_more_instances_or_samples_generate_only_the_new_units(bench) -> None:
    bench(*FLAGS)
    more = list(FLAGS)
    more[more.index("--episodes") + 1] = "4"
    more[more.index("--sc-n") + 1] = "5"
    results, _ = bench(*more)
    # instance 3 of cot and mad (2), sc: 2 new samples of instances 0-2 and 5 of instance 3
    assert results["units"] == {"generated": 2 + 2 * 3 + 5, "resumed": 15}
    assert {r["method"]: r["episodes"] for r in results["rows"]} == {"CoT": 4, "SC (n=5)": 20, "MAD": 4}


def test_resuming_with_other_generation_settings_is_refused(bench) -> None:
    bench(*FLAGS)
    with pytest.raises(RunConfigError, match="max_new_tokens"):
        bench(*FLAGS, "--max-new-tokens", "32")


def test_written_results_are_kept_only_while_they_hold_the_same_rows_and_files(bench) -> None:
    from benchmarks.evaluation.outputs import written_results

    first, out = bench(*FLAGS)
    played = {k: first[k] for k in ("rows", "tasks", "methods", "curves")}
    assert written_results(out, played) == json.loads((out / "results.json").read_text())
    moved = json.loads(json.dumps(played))
    moved["rows"][0]["score"] = 1.0 - moved["rows"][0]["score"]
    assert written_results(out, moved) is None  # other rows: written again
    (out / "viewer.html").unlink()  # a generated page, not committed: its absence keeps the results
    assert written_results(out, played) == json.loads((out / "results.json").read_text())
    (out / "report.md").unlink()
    assert written_results(out, played) is None  # a file it names is gone: written again
    assert written_results(out / "nowhere", played) is None


@pytest.mark.slow
def test_a_checkpoint_changed_in_place_is_played_again_not_resumed(bench, tmp_path) -> None:
    from tests.tiny_model import make_tiny_model

    folder = make_tiny_model(tmp_path / "ckpt", seed=0)
    flags = ("--suite", "smoke", "--model", "scripted", "--methods", "mad", "--episodes", "2")
    flags += ("--max-new-tokens", "4", "--checkpoint", f"T={folder}")
    first, out = bench(*flags)
    assert first["units"] == {"generated": 4, "resumed": 0}
    (key,) = {m["key"] for m in first["methods"]} - {"mad"}
    assert key.startswith("ckpt:T@") and len(key) == len("ckpt:T@") + 12
    assert bench(*flags)[0]["units"] == {"generated": 0, "resumed": 4}  # same weights: resumed

    make_tiny_model(folder, seed=1)  # retrained into the same folder
    third, _ = bench(*flags)
    assert third["units"] == {"generated": 2, "resumed": 4}  # only T's two episodes are new
    (new_key,) = {m["key"] for m in third["methods"]} - {"mad"}
    assert new_key.startswith("ckpt:T@") and new_key != key
    played = {e.metadata["method"] for e in read_episodes(out / "episodes.jsonl")}
    assert played == {"mad", key, new_key}  # the old model's episodes stay on file, unreported
    assert {r["method"]: r["episodes"] for r in third["rows"]} == {"MAD": 2, "T": 2}
