"""OpenAI-compatible HTTP backend: chat completions over ``httpx``, sent as concurrent requests.

Works with any server speaking ``POST {base_url}/chat/completions`` (vLLM's OpenAI server,
llama.cpp's, hosted APIs). A batch is sent as concurrent requests from a thread pool
(``max_concurrency`` at a time); requests rotate over several ``base_urls`` (round robin, and a
retry moves on to the next one). Connection errors, timeouts, HTTP 429 and 5xx are retried with
exponential backoff (``Retry-After`` is honoured, up to ``max_backoff``); any other HTTP error
fails at once. A request that still fails after ``max_retries`` retries raises
:class:`~optima_env.errors.BackendError` naming the servers and the last error.

Replicas: a server that refuses or drops connections (killed, restarting, unreachable) is taken
out of the rotation for ``cooldown`` seconds, with one warning naming it; its requests, in flight
or new, go at once to the other replicas (without backoff, and without using up a retry), so a
batch finishes on the survivors. After the cool-down one request tries it again: if it answers
it is back in the rotation (logged), else it stays out. Only when every replica is out do
requests wait and retry as above. A slow server (read timeout) is not taken out. Every request
carries its own seed, so a reply does not depend on the replica that produced it.

The API key is read from the environment variable ``api_key_env`` (default ``OPENAI_API_KEY``)
at each request, never stored on the object; none is sent when it is unset, as local servers
need none. It is kept out of logs, reprs and error messages.

The forced reply prefix (``"Alice:"``): chat APIs cannot force the start of a reply, so by default
(``prefix_mode="prepend"``) the conversation is sent as is and the prefix is put in front of the
returned text, unless the model already wrote it. With ``prefix_mode="continue"`` (vLLM servers)
the prefix is sent as a final assistant message that the model continues
(``continue_final_message``), as the local backends do. Tokens are counted by the environment
with the model's tokenizer, so counts do not depend on the backend that produced a turn.
``SamplingParams.ignore_eos`` is sent as vLLM's ``ignore_eos`` extension; ``seed`` and ``stop`` are
standard fields.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Literal

from optima_env.errors import BackendError, TaskContractError, require
from optima_env.policy import GenerationRequest, SamplingParams, finish_reply, request_seed

__all__ = ["OpenAIChatPolicy"]

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
"""HTTP statuses worth retrying: timeouts, rate limits and server-side failures."""


class OpenAIChatPolicy:
    """A :class:`~optima_env.policy.ChatPolicy` over OpenAI-compatible chat-completion servers.

    Args:
        model: the model name the server expects.
        base_urls: one base URL or several, each ending in ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``).
        api_key_env: the environment variable holding the API key (``None``: send none).
        max_concurrency: requests in flight at once.
        timeout: seconds to wait for a response (read, write and pool); ``connect_timeout`` for
            opening the connection.
        max_retries: retries after the first attempt of each request.
        backoff: the first retry's delay in seconds; it doubles at each retry, up to ``max_backoff``.
        prefix_mode: ``prepend`` (any server) or ``continue`` (vLLM), see the module docs.
        extra_body: more JSON fields for every request (e.g. ``{"top_k": 20}``).
        cooldown: seconds a replica that refused or dropped a connection stays out of the rotation.
    """

    # size: the OpenAI-compatible client's options (URLs, key, retries, timeouts), keywords with defaults
    def __init__(
        self,
        model: str,
        base_urls: str | Sequence[str] = "http://127.0.0.1:8000/v1",
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        max_concurrency: int = 32,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        prefix_mode: Literal["prepend", "continue"] = "prepend",
        extra_body: Mapping[str, Any] | None = None,
        cooldown: float = 30.0,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise TaskContractError(
                "base_urls must be one or more http(s) URLs such as 'http://127.0.0.1:8000/v1', "
                f"got {base_urls!r}"
            )
        if not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise TaskContractError(f"max_concurrency must be an int >= 1, got {max_concurrency!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise TaskContractError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if prefix_mode not in ("prepend", "continue"):
            raise TaskContractError(f"prefix_mode must be 'prepend' or 'continue', got {prefix_mode!r}")
        if timeout <= 0 or connect_timeout <= 0 or backoff < 0 or max_backoff < 0 or cooldown < 0:
            raise TaskContractError(
                "timeout and connect_timeout must be > 0, backoff, max_backoff and cooldown >= 0"
            )
        httpx = require("httpx", "openai")
        self.model = model
        self.base_urls = [u.rstrip("/") for u in urls]
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.prefix_mode = prefix_mode
        self.extra_body = dict(extra_body or {})
        self.api_key_env = api_key_env
        self.cooldown = cooldown
        self._down_until: dict[str, float] = {}  # replica -> monotonic time it may be tried again
        self._replies: dict[str, int] = dict.fromkeys(self.base_urls, 0)
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="optima-openai")
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"OpenAIChatPolicy(model={self.model!r}, base_urls={self.base_urls!r}, "
            f"api_key_env={self.api_key_env!r}, max_concurrency={self.max_concurrency})"
        )

    # -- public ---------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        futures = [self._pool.submit(self._complete, r, sampling) for r in requests]
        wait(futures)
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            first = errors[0]
            message = f"{len(errors)} of {len(requests)} chat requests failed; first: {first}"
            if isinstance(first, BackendError):
                raise BackendError(message) from first
            raise BackendError(f"{message} ({type(first).__name__})") from first
        return [f.result() for f in futures]

    def close(self) -> None:
        """Close the connection pool and the worker threads."""
        self._pool.shutdown(wait=True)
        self._client.close()

    def __enter__(self) -> OpenAIChatPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one request ----------------------------------------------------------------------------
    def _payload(self, request: GenerationRequest, sampling: SamplingParams) -> dict[str, Any]:
        messages = [{"role": m["role"], "content": m["content"]} for m in request.messages]
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if self.prefix_mode == "continue" and request.prefix:
            messages.append({"role": "assistant", "content": request.prefix})
            payload.update(add_generation_prompt=False, continue_final_message=True)
        if sampling.seed is not None:
            payload["seed"] = request_seed(sampling.seed, request.key)
        if sampling.stop:
            payload["stop"] = list(sampling.stop)
        if sampling.ignore_eos:
            payload["ignore_eos"] = True
        payload.update(self.extra_body)
        return payload

    def _complete(self, request: GenerationRequest, sampling: SamplingParams) -> str:
        content = self._post(self._payload(request, sampling))
        prefix = request.prefix
        if self.prefix_mode == "continue" or not prefix:
            return finish_reply(prefix, content, sampling.stop)
        text = content.lstrip()
        if text.startswith(prefix):
            return finish_reply(prefix, text[len(prefix) :], sampling.stop)
        return finish_reply(prefix, " " + text, sampling.stop)

    def _auth(self) -> dict[str, str]:
        """The Authorization header, read from the environment at each request (never stored)."""
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return {"Authorization": f"Bearer {key}"} if key else {}

    # -- replicas -------------------------------------------------------------------------------
    def live_replicas(self) -> list[str]:
        """The base URLs in the rotation now (those not cooling down after a dropped connection)."""
        now = time.monotonic()
        with self._lock:
            return [u for u in self.base_urls if self._down_until.get(u, 0.0) <= now]

    def replies_by_replica(self) -> dict[str, int]:
        """Successful chat completions per base URL so far."""
        with self._lock:
            return dict(self._replies)

    def _pick(self, turn: int) -> str:
        live = self.live_replicas() or self.base_urls  # all out: try them anyway (with backoff)
        return live[turn % len(live)]

    def _mark_down(self, base: str, error: str) -> bool:
        """Take ``base`` out of the rotation; True when another replica is left to fail over to."""
        with self._lock:
            new = base not in self._down_until
            self._down_until[base] = time.monotonic() + self.cooldown
        others = [u for u in self.live_replicas() if u != base]
        if new:
            logger.warning(
                "replica %s is out of the rotation for %gs: %s; sending its requests to %s",
                base,
                self.cooldown,
                error,
                ", ".join(others) if others else "no other replica (every one is out: retrying with backoff)",
            )
        return bool(others)

    def _mark_up(self, base: str) -> None:
        with self._lock:
            if self._down_until.pop(base, None) is None:
                return
        logger.info("replica %s answers again; back in the rotation", base)

    def _post(self, payload: dict[str, Any]) -> str:
        httpx = require("httpx", "openai")
        with self._lock:
            start = next(self._counter)
        last = "no attempt made"
        attempt = failovers = 0
        while True:
            base = self._pick(start + attempt + failovers)
            url = base + "/chat/completions"
            retry_after = 0.0
            try:
                response = self._client.post(url, json=payload, headers=self._auth())
            except _dropped_connection(httpx) as exc:  # refused, reset or cut: the replica is gone
                last = f"{url}: {type(exc).__name__}: {exc}"
                if self._mark_down(base, f"{type(exc).__name__}: {exc}") and failovers < len(self.base_urls):
                    failovers += 1
                    continue  # at once, to a live replica; not counted as a retry
            except httpx.TimeoutException as exc:
                last = f"{url}: no answer within {self.timeout:g}s ({type(exc).__name__})"
            except httpx.TransportError as exc:
                last = f"{url}: {type(exc).__name__}: {exc}"
            else:
                self._mark_up(base)
                if response.status_code == 200:
                    content = _content(response, url)
                    with self._lock:
                        self._replies[base] += 1
                    return content
                last = f"{url}: HTTP {response.status_code}: {response.text[:300]!r}"
                if response.status_code not in RETRY_STATUSES:
                    raise BackendError(
                        f"the server rejected the chat request ({last}); check the model name "
                        f"{self.model!r}, the API key variable {self.api_key_env!r} and the request fields"
                    )
                retry_after = _retry_after(response.headers.get("retry-after"))
            if attempt == self.max_retries:
                break
            delay = min(self.max_backoff, max(self.backoff * 2**attempt, retry_after))
            delay *= 1 + 0.1 * random.random()
            logger.warning(
                "chat request attempt %d/%d failed (%s); retrying in %.2fs",
                attempt + 1,
                self.max_retries + 1,
                last,
                delay,
            )
            time.sleep(delay)
            attempt += 1
        raise BackendError(
            f"chat completion failed after {self.max_retries + 1} attempts over {self.base_urls}; "
            f"last error: {last}. Check that the server is up and reachable, or raise "
            "max_retries/timeout if it is slow"
        )


def _dropped_connection(httpx: Any) -> tuple[type[BaseException], ...]:
    """httpx errors meaning the server is not there (not merely slow): refused or timed-out
    connects, connections reset or closed before the response."""
    return (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.RemoteProtocolError,
        httpx.ReadError,
        httpx.WriteError,
    )


def _content(response: Any, url: str) -> str:
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


def _retry_after(value: str | None) -> float:
    """Seconds from a ``Retry-After`` header (a number of seconds; dates are ignored)."""
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:
        return 0.0
