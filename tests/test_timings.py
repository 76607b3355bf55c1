"""``python -m tests.timings``: the suite's time by folder, file and fixture, from a real pytest run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.timings import main

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_a_durations_log_and_fixture_times_are_summed_by_folder_file_and_fixture(tmp_path, capsys) -> None:
    suite = tmp_path / "suite" / "inner"
    suite.mkdir(parents=True)
    (suite / "test_a.py").write_text(textwrap.dedent("""
        import time
        import pytest

        @pytest.fixture(scope="module")
        def slow_thing():
            time.sleep(0.3)
            return 1

        def test_one(slow_thing):
            assert slow_thing == 1

        def test_two(slow_thing):
            time.sleep(0.1)
    """))
    fixtures = tmp_path / "fixtures.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not an xdist worker
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(suite), "-p", "tests.timings", "--durations=0", "-vv",
         "--fixture-times", str(fixtures), "-p", "no:cacheprovider", "--rootdir", str(tmp_path)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    log = tmp_path / "pytest.log"
    log.write_text(run.stdout)
    assert main([str(log), "--fixtures", str(fixtures)]) == 0
    out = capsys.readouterr().out
    assert "2 tests" in out
    folder = next(line for line in out.splitlines() if line.endswith("suite/inner"))
    assert float(folder.split()[0]) >= 0.4  # the fixture's 0.3 s (in setup) and test_two's 0.1 s
    fixture = next(line for line in out.splitlines() if line.endswith("slow_thing (module)"))
    assert float(fixture.split()[0]) >= 0.3
    records = [json.loads(line) for line in fixtures.read_text().splitlines()]
    assert [r["node"] for r in records if r["fixture"] == "slow_thing"] == ["suite/inner/test_a.py"]  # once


def test_a_log_without_durations_says_how_to_make_one(tmp_path) -> None:
    log = tmp_path / "pytest.log"
    log.write_text("1 passed in 0.01s\n")
    with pytest.raises(SystemExit):
        main([str(log)])
