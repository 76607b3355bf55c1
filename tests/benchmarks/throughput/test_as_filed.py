"""The side-by-side run of the engine as issue 49 found it: its table, and a commit this clone does
not hold refused before anything runs. (The run itself plays three engines for minutes each: it is
a benchmark, run by hand.)"""

from __future__ import annotations

import doctest

from benchmarks.throughput import as_filed


def test_the_table_gives_the_new_engine_against_each_row() -> None:
    assert doctest.testmod(as_filed).failed == 0
    table = as_filed.table({"as filed": 50.0, "engine_old": 80.0, "engine": 100.0})
    assert "| as filed | 50.0 | 2.00x |" in table and "| engine_old | 80.0 | 1.25x |" in table


def test_a_commit_outside_the_history_is_refused_with_what_to_do(tmp_path, capsys) -> None:
    status = as_filed.main(["--out", str(tmp_path / "out"), "--commit", "0" * 40])
    assert status == 2
    err = capsys.readouterr().err
    assert "expected a commit of this repository's history" in err and "git clone" in err
    assert not (tmp_path / "out").exists()  # nothing ran
