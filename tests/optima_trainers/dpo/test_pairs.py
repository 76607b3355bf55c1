"""Pair selection (top 50% per tree), the TRL preference format and the pair records."""

from __future__ import annotations

import json

import pytest

from optima_env.errors import DataError, TaskContractError
from optima_trainers.dpo.pairs import pairs_to_dpo_dataset, select_top_pairs
from optima_trainers.run.records import PreferencePair, read_pairs, write_pairs


def pair(value: float, *, sample: str = "s0", depth: int = 0, chosen: str = "Alice: yes") -> PreferencePair:
    return PreferencePair(
        prompt=({"role": "system", "content": "You are Alice."}, {"role": "assistant", "content": "Bob: hi"}),
        chosen=chosen,
        rejected="Alice: no",
        chosen_value=value,
        rejected_value=value - 0.5,
        task_id="test/tiny-v0",
        sample_id=sample,
        instance_index=0,
        depth=depth,
        agent="Alice",
    )


@pytest.mark.parametrize(("n", "kept"), [(0, 0), (1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (9, 4)])
def test_top_half_per_tree_and_a_single_pair_is_kept(n: int, kept: int) -> None:
    values = [0.1 * (i % 7) + 0.01 * i for i in range(n)]
    out = select_top_pairs([[pair(v, depth=i) for i, v in enumerate(values)]])
    assert len(out) == kept
    assert [p.chosen_value for p in out] == sorted(values, reverse=True)[:kept]


def test_selection_is_per_tree_not_global() -> None:
    tree_a = [pair(0.9, sample="a"), pair(0.8, sample="a")]
    tree_b = [pair(0.5, sample="b"), pair(0.45, sample="b"), pair(0.6, sample="b"), pair(0.41, sample="b")]
    out = select_top_pairs([tree_a, tree_b])
    assert [(p.sample_id, p.chosen_value) for p in out] == [("a", 0.9), ("b", 0.6), ("b", 0.5)]
    assert select_top_pairs([tree_a, tree_b], fraction=1.0) == [tree_a[0], tree_a[1], *sorted(
        tree_b, key=lambda p: -p.chosen_value)]  # fmt: skip
    with pytest.raises(TaskContractError, match="fraction"):
        select_top_pairs([tree_a], fraction=0.0)


@pytest.mark.parametrize(("n", "train"), [(1, 1), (5, 4), (10, 9), (20, 18), (25, 22)])
def test_dpo_rows_split_ninety_ten_in_order(n: int, train: int) -> None:
    pairs = [pair(0.5, depth=i, chosen=f"Alice: {i}") for i in range(n)]
    data = pairs_to_dpo_dataset(pairs)
    assert len(data.train) == train and len(data.eval) == n - train
    assert [r["chosen"][0]["content"] for r in data.train + data.eval] == [f"Alice: {i}" for i in range(n)]
    row = data.train[0]
    assert row == {
        "prompt": [
            {"role": "system", "content": "You are Alice."},
            {"role": "assistant", "content": "Bob: hi"},
        ],
        "chosen": [{"role": "assistant", "content": "Alice: 0"}],
        "rejected": [{"role": "assistant", "content": "Alice: no"}],
    }
    from trl.data_utils import is_conversational

    assert is_conversational(row)


def test_pairs_round_trip_through_jsonl(tmp_path) -> None:
    pairs = [pair(0.7, depth=2), pair(-0.25, sample="s1")]
    write_pairs(tmp_path / "pairs.jsonl", pairs)
    assert read_pairs(tmp_path / "pairs.jsonl") == pairs
    assert pairs[0].margin == pytest.approx(0.5)


def test_bad_pair_records_raise_clear_errors(tmp_path) -> None:
    bad = pair(0.5).to_dict()
    bad["prompt"][0]["role"] = "narrator"
    with pytest.raises(DataError, match="role"):
        PreferencePair.from_dict(bad)
    missing = pair(0.5).to_dict()
    del missing["chosen"]
    (tmp_path / "p.jsonl").write_text(json.dumps(pair(0.5).to_dict()) + "\n" + json.dumps(missing) + "\n")
    with pytest.raises(DataError, match=r"p\.jsonl, line 2: .*field 'chosen': missing"):
        read_pairs(tmp_path / "p.jsonl")
    with pytest.raises(DataError, match="chosen_value"):
        pair(float("nan"))
