"""Fixtures of the benchmark tests: an in-process runner and a plugin manager with test tasks."""

from __future__ import annotations

import pytest

from benchmarks.run import parse_args, run
from optima_env import get_plugin_manager
from tests.benchmarks.bench_helpers import NoDataPlugin
from tests.helpers import TinyTaskPlugin


@pytest.fixture
def test_pm():
    """The installed plugins plus the tiny task and the task without data."""
    manager = get_plugin_manager()
    plugins = [TinyTaskPlugin(), NoDataPlugin()]
    for plugin in plugins:
        manager.register(plugin)
    try:
        yield manager
    finally:
        for plugin in plugins:
            manager.unregister(plugin)


@pytest.fixture
def bench(tmp_path):
    """Run ``benchmarks.run`` in-process: ``bench(*flags, pm=None, out=None) -> (results, out)``."""

    def go(*argv: str, pm=None, out=None):
        out = out or tmp_path / "run"
        results = run(parse_args([*argv, "--out", str(out)]), pm=pm)
        return results, out

    return go
