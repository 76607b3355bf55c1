"""The README's generated blocks: replaced between their markers, from the suites' own results."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.reports.readme import performance_block, replace_block
from optima_env.errors import DataError


def test_a_block_is_replaced_between_its_markers_and_only_there(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- begin performance -->\nold\n<!-- end performance -->\noutro\n")
    replace_block(readme, "performance", "new table\n")
    replace_block(readme, "performance", "new table\n")  # idempotent
    assert (
        readme.read_text()
        == "intro\n<!-- begin performance -->\nnew table\n<!-- end performance -->\noutro\n"
    )
    with pytest.raises(DataError, match="expected the markers '<!-- begin demo -->'"):
        replace_block(readme, "demo", "x")


def test_the_performance_block_quotes_each_suites_results_with_its_command(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "results.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    (loop / "command.txt").write_text("python -m benchmarks.run --suite loop --out x\n")
    block = performance_block({"loop": loop})
    assert "**Rollout throughput (`--suite rollout`)**: not run yet." in block
    assert "(`python -m benchmarks.run --suite loop --out x`):" in block and "| 1 | 2 |" in block
