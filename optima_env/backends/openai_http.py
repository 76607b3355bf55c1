"""The HTTP pieces of the OpenAI-compatible client (:mod:`optima_env.backends.openai`): reading a
chat completion, which errors mean a replica is gone, and the administration calls.

* :func:`served_base_model`: the base model a server serves (``GET /v1/models``; vLLM lists the
  base with ``parent: null`` and each loaded adapter with its base as ``parent``).
* :func:`load_lora_adapter` / :func:`unload_lora_adapter`: vLLM's runtime adapter endpoints
  (``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``). They exist only on a server
  started with ``--enable-lora`` (and ``--max-lora-rank`` at least the adapter's rank) and the
  environment variable ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; the adapter's path is read by
  the server, so it must see the same file system (a shared folder) at that path. A refusal
  raises :class:`~optima_env.errors.BackendError` saying how to start the server.

Each call takes the caller's ``httpx.Client`` and a base URL ending in ``/v1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from optima_env.errors import BackendError

__all__ = [
    "LORA_SERVER_HINT",
    "RETRY_STATUSES",
    "chat_content",
    "dropped_connection",
    "load_lora_adapter",
    "retry_after",
    "served_base_model",
    "unload_lora_adapter",
]

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
"""HTTP statuses worth retrying: timeouts, rate limits and server-side failures."""

LORA_SERVER_HINT = (
    "start each vLLM server with --enable-lora --max-lora-rank R (R >= the adapter's rank) and the "
    "environment variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, on a file system where the adapter's "
    "path is readable; or deliver full weights yourself (generation.server_weights=hook and a plugin "
    "implementing optima_deliver_weights)"
)
"""What a server needs to take runtime LoRA adapters."""


def served_base_model(client: Any, base_url: str, headers: Mapping[str, str]) -> str:
    """The one base model ``base_url`` serves (``GET {base_url}/models``).

    Raises:
        BackendError: the server does not answer, answers something else than a model list, or
            serves no base model or several (then the model must be named).
    """
    url = f"{base_url}/models"
    response = client.get(url, headers=dict(headers))
    if response.status_code != 200:
        raise BackendError(f"{url} answered HTTP {response.status_code}: {response.text[:200]!r}")
    try:
        entries = response.json()["data"]
        bases = [e["id"] for e in entries if not e.get("parent")]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BackendError(
            f"{url} did not answer an OpenAI model list ({{'data': [{{'id': ...}}]}}): "
            f"{response.text[:200]!r}"
        ) from exc
    if len(bases) != 1:
        raise BackendError(
            f"{url} serves {len(bases)} base models {bases}; name the one to use "
            "(generation.served_model, or the policy's model argument)"
        )
    return str(bases[0])


def load_lora_adapter(client: Any, base_url: str, name: str, path: str, headers: Mapping[str, str]) -> bool:
    """Load the PEFT adapter folder ``path`` on ``base_url`` under ``name``; False when it was
    loaded already (vLLM answers 400 "already been loaded"), True when loaded now.

    Raises:
        BackendError: the server refuses (no runtime LoRA, a rank above its maximum, a path it
            cannot read), with :data:`LORA_SERVER_HINT`.
    """
    url = f"{base_url}/load_lora_adapter"
    response = client.post(url, json={"lora_name": name, "lora_path": path}, headers=dict(headers))
    if response.status_code == 200:
        return True
    text = response.text[:300]
    if response.status_code == 400 and "already been loaded" in text:
        return False
    raise BackendError(
        f"{url} refused to load the LoRA adapter {name!r} from {path} (HTTP {response.status_code}: "
        f"{text!r}); {LORA_SERVER_HINT}"
    )


def unload_lora_adapter(client: Any, base_url: str, name: str, headers: Mapping[str, str]) -> bool:
    """Unload adapter ``name`` from ``base_url``; False when the server did not have it."""
    url = f"{base_url}/unload_lora_adapter"
    response = client.post(url, json={"lora_name": name}, headers=dict(headers))
    if response.status_code == 200:
        return True
    if response.status_code == 404:
        return False
    raise BackendError(
        f"{url} refused to unload the LoRA adapter {name!r} "
        f"(HTTP {response.status_code}: {response.text[:200]!r})"
    )


def dropped_connection(httpx: Any) -> tuple[type[BaseException], ...]:
    """httpx errors meaning the server is not there (not merely slow): refused or timed-out
    connects, connections reset or closed before the response."""
    return (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.RemoteProtocolError,
        httpx.ReadError,
        httpx.WriteError,
    )


def chat_content(response: Any, url: str) -> str:
    """``choices[0].message.content`` of a chat-completion response, or a clear error."""
    try:
        data = response.json()
    except ValueError as exc:
        raise BackendError(
            f"{url} answered HTTP 200 with a body that is not JSON: {response.text[:200]!r}"
        ) from exc
    try:
        content = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise BackendError(
            f"{url} answered without choices[0].message.content (an OpenAI chat completion was expected), "
            f"got {str(data)[:200]!r}"
        ) from exc
    if content is None:
        return ""
    if not isinstance(content, str):
        raise BackendError(f"{url} answered a non-string message content: {type(content).__name__}")
    return content


def retry_after(value: str | None) -> float:
    """Seconds from a ``Retry-After`` header (a number of seconds; dates are ignored)."""
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:
        return 0.0
