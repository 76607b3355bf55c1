"""The generated blocks (the README's demo block, the performance page's block): replaced between
their markers, from the suites' own results."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.reports.readme import performance_block, replace_block
from benchmarks.run import PERFORMANCE_PAGE, REPO_README, unlinked, update_performance_page
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


def test_each_generated_block_has_its_markers_where_the_suites_write_it() -> None:
    """``--update-readme``: the demo block is the README's, the performance block the performance
    page's (:data:`benchmarks.run.PERFORMANCE_PAGE`), and the page's block links no repository file
    (the strict site build refuses those links; the text names the file)."""
    readme = REPO_README.read_text(encoding="utf-8")
    assert readme.index("<!-- begin demo -->") < readme.index("<!-- end demo -->")
    assert "<!-- begin performance -->" not in readme
    page = PERFORMANCE_PAGE.read_text(encoding="utf-8")
    block = page.split("<!-- begin performance -->", 1)[1].split("<!-- end performance -->", 1)[0]
    assert "`benchmarks/results/rollout/results.md`" in block and unlinked(block) == block


def test_a_block_for_a_page_keeps_the_text_of_its_repository_links(tmp_path: Path) -> None:
    rollout = tmp_path / "rollout"
    rollout.mkdir()
    (rollout / "results.md").write_text("| a |\n|---|\n| 1 |\n")
    block = unlinked(performance_block({"rollout": rollout}))
    assert "](" not in block and f"`{rollout / 'results.md'}`" in block
    kept = "[docs](https://example.org/x) [here](#anchor)"
    assert unlinked(kept) == kept


def test_update_readme_rewrites_the_performance_pages_block_from_a_suites_run(tmp_path: Path) -> None:
    """What ``--suite rollout|loop --update-readme`` does, on a copy of the page: the run's
    results replace its suite's table, the other suites' committed tables stay, the rest of the
    page is untouched."""
    page = tmp_path / "performance.md"
    page.write_text(PERFORMANCE_PAGE.read_text(encoding="utf-8"), encoding="utf-8")
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "results.md").write_text("| trainer | total s |\n|---|---|\n| isft | 1.0 |\n")
    (loop / "command.txt").write_text("python -m benchmarks.run --suite loop --out x --update-readme\n")
    update_performance_page({"loop": loop}, page=page)
    before, after = PERFORMANCE_PAGE.read_text(encoding="utf-8"), page.read_text(encoding="utf-8")
    assert after.split("<!-- begin performance -->")[0] == before.split("<!-- begin performance -->")[0]
    assert after.split("<!-- end performance -->")[1] == before.split("<!-- end performance -->")[1]
    block = after.split("<!-- begin performance -->")[1].split("<!-- end performance -->")[0]
    assert "| isft | 1.0 |" in block and "`benchmarks/results/rollout/results.md`" in block
    assert f"`{loop}/results.md` (`python -m benchmarks.run --suite loop --out x --update-readme`):" in block
    assert "](" not in block
