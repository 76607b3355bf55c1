"""OpenAI-compatible HTTP backend: chat completions over ``httpx``, sent as concurrent requests.

Works with any server speaking ``POST {base_url}/chat/completions`` (vLLM's OpenAI server,
llama.cpp's, hosted APIs). A batch is sent as concurrent requests from a thread pool
(``max_concurrency`` at a time). It is also a :class:`~optima_env.policy.TurnEngine`: ``submit``
sends one request at once on the pool and ``poll`` hands back each reply as soon as it arrives, so
no conversation waits for another's turn (``capacity`` is ``None``: the servers batch).

Replicas (:mod:`optima_env.backends.replicas`): a request with a ``session`` (its conversation)
always goes to the session's replica (rendezvous hashing over ``base_urls``), so that the server's
prefix cache serves the conversation's earlier turns; it moves only when that replica fails.
Requests without a session rotate round robin, and a retry moves on to the next one. Connection
errors, timeouts, HTTP 429 and 5xx are retried with exponential backoff (``Retry-After`` is
honoured, up to ``max_backoff``); any other HTTP error fails at once. A request that still fails
after ``max_retries`` retries raises :class:`~optima_env.errors.BackendError` naming the servers and
the last error.

Replicas: a server that refuses or drops connections (killed, restarting, unreachable) is taken out
of the rotation for ``cooldown`` seconds, with one warning naming it; its requests, in flight or
new, go at once to the other replicas (a session to its next replica, where it then stays; without
backoff, and without using up a retry), so a batch finishes on the survivors. After the cool-down
one request tries it again: if it answers it is back in the rotation (logged), else it stays out.
Only when every replica is out do requests wait and retry as above. A slow server (read timeout) is
not taken out. Every request carries its own seed, so a reply does not depend on the replica that
produced it.

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

Weights that change at run time (the trainer, :mod:`optima_trainers.generation.engines`): :meth:`serve`
switches the model name the requests ask for, and with ``adapter=`` first loads a PEFT LoRA
adapter on every live replica under that name (vLLM's runtime LoRA,
:mod:`optima_env.backends.openai_http`); a replica that answers 404 for it later (restarted
since) gets it loaded again before the request is retried.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Literal

from optima_env.backends import openai_http
from optima_env.backends.replicas import ReplicaSet
from optima_env.errors import BackendError, TaskContractError, require
from optima_env.policy import GenerationRequest, SamplingParams, finish_reply, request_seed

__all__ = ["OpenAIChatPolicy"]

logger = logging.getLogger(__name__)


class OpenAIChatPolicy:
    """A :class:`~optima_env.policy.ChatPolicy` and :class:`~optima_env.policy.TurnEngine` over
    OpenAI-compatible chat-completion servers.

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
        tokenizer: the served model's tokenizer, exposed as ``policy.tokenizer`` so that the
            environment counts turns with it (``None``: the caller counts otherwise).
    """

    capacity: int | None = None
    """:class:`~optima_env.policy.TurnEngine`: no fixed bound (the servers batch what they get)."""

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
        tokenizer: Any = None,
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
        self.tokenizer = tokenizer
        self.adapter: tuple[str, str] | None = None
        """``(name, path)`` of the LoRA adapter the requests ask for (set by :meth:`serve`)."""
        self._replicas = ReplicaSet(self.base_urls, cooldown)
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="optima-openai")
        self._pending: dict[int, Future[str]] = {}
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
            raise _failure(errors[0], f"{len(errors)} of {len(requests)} chat requests failed")
        return [f.result() for f in futures]

    def submit(self, ticket: int, request: GenerationRequest, sampling: SamplingParams) -> None:
        """:class:`~optima_env.policy.TurnEngine`: send ``request`` now (on the thread pool)."""
        if ticket in self._pending:
            raise TaskContractError(f"ticket {ticket!r} is already pending; tickets must be unique")
        self._pending[ticket] = self._pool.submit(self._complete, request, sampling)

    def poll(self) -> list[tuple[int, str]]:
        """:class:`~optima_env.policy.TurnEngine`: the replies arrived since the last call (waits
        for at least one while any request is pending). A failed request raises
        :class:`~optima_env.errors.BackendError`; the others still pending are dropped."""
        if not self._pending:
            return []
        wait(list(self._pending.values()), return_when=FIRST_COMPLETED)
        done = [(t, f) for t, f in self._pending.items() if f.done()]
        for ticket, _ in done:
            del self._pending[ticket]
        errors = [f.exception() for _, f in done if f.exception() is not None]
        if errors:
            dropped = len(self._pending)
            for future in self._pending.values():
                future.cancel()
            self._pending.clear()
            raise _failure(errors[0], f"a chat request failed ({dropped} pending requests dropped)")
        return [(t, f.result()) for t, f in done]

    def serve(self, model: str, *, adapter: str | None = None) -> None:
        """Ask for ``model`` from now on (a new stage's weights; its conversations are new).

        With ``adapter`` (a PEFT LoRA folder the servers can read), the adapter is first loaded
        under the name ``model`` on every replica that answers (vLLM's runtime LoRA); the
        previous adapter, if another one, is unloaded. A replica that does not answer is taken
        out of the rotation (it gets the adapter when it answers a request with 404 later).

        Raises:
            BackendError: a server refused the adapter (with how to start it), or no replica
                answered.
        """
        httpx = require("httpx", "openai")
        previous = self.adapter
        if adapter is not None:
            loaded = []
            for base in self.base_urls:
                try:
                    openai_http.load_lora_adapter(self._client, base, model, adapter, self._auth())
                except openai_http.dropped_connection(httpx) as exc:
                    self._replicas.mark_down(base, f"{type(exc).__name__}: {exc}")
                    continue
                loaded.append(base)
            if not loaded:
                raise BackendError(
                    f"no replica of {self.base_urls} answered to load the LoRA adapter {adapter}; "
                    "check that the servers are up"
                )
            logger.info("LoRA adapter %s loaded as %r on %s", adapter, model, ", ".join(loaded))
        self.model = model
        self.adapter = (model, adapter) if adapter is not None else None
        self._replicas.forget_sessions()
        if previous is not None and previous[0] != model:
            for base in self.live_replicas():
                try:
                    openai_http.unload_lora_adapter(self._client, base, previous[0], self._auth())
                except (httpx.TransportError, BackendError) as exc:  # only frees server memory
                    logger.warning("could not unload LoRA adapter %r from %s: %s", previous[0], base, exc)

    def served_base_model(self) -> str:
        """The base model name the first answering replica serves (``GET /v1/models``)."""
        httpx = require("httpx", "openai")
        errors = []
        for base in self.live_replicas() or self.base_urls:
            try:
                return openai_http.served_base_model(self._client, base, self._auth())
            except openai_http.dropped_connection(httpx) as exc:
                errors.append(f"{base}: {type(exc).__name__}: {exc}")
        raise BackendError(
            f"no replica answered GET /v1/models ({'; '.join(errors)}); check that the servers are up"
        )

    def close(self) -> None:
        """Close the connection pool and the worker threads."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
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
        content = self._post(self._payload(request, sampling), tuple(request.session))
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
        return self._replicas.live()

    def replies_by_replica(self) -> dict[str, int]:
        """Successful chat completions per base URL so far."""
        return self._replicas.replies()

    def placements(self) -> dict[tuple[object, ...], tuple[str, ...]]:
        """Session -> the base URLs that answered its requests (one unless its replica failed),
        since the last :meth:`serve`."""
        return self._replicas.placements()

    def _reload_adapter(self, base: str, payload: Mapping[str, Any]) -> bool:
        """``base`` answered 404 for the adapter the request asks for (restarted since it was
        loaded): load it there again; True when the request should be sent again."""
        adapter = self.adapter
        if adapter is None or payload.get("model") != adapter[0]:
            return False
        logger.info("replica %s does not have the LoRA adapter %r (restarted?); loading it", base, adapter[0])
        openai_http.load_lora_adapter(self._client, base, adapter[0], adapter[1], self._auth())
        return True

    def _post(self, payload: dict[str, Any], session: tuple[object, ...] = ()) -> str:
        httpx = require("httpx", "openai")
        with self._lock:
            start = next(self._counter)
        last = "no attempt made"
        attempt = failovers = 0
        reloaded = False
        failed: list[str] = []  # replicas that dropped this request (not tried again before a backoff)
        while True:
            base = self._replicas.pick(session, start + attempt + failovers, exclude=failed)
            url = base + "/chat/completions"
            retry_after = 0.0
            try:
                response = self._client.post(url, json=payload, headers=self._auth())
            except openai_http.dropped_connection(httpx) as exc:  # refused, reset or cut: the replica is gone
                last = f"{url}: {type(exc).__name__}: {exc}"
                failed.append(base)
                if self._replicas.mark_down(base, f"{type(exc).__name__}: {exc}") and failovers < len(
                    self.base_urls
                ):
                    failovers += 1
                    continue  # at once, to a live replica; not counted as a retry
            except httpx.TimeoutException as exc:
                last = f"{url}: no answer within {self.timeout:g}s ({type(exc).__name__})"
            except httpx.TransportError as exc:
                last = f"{url}: {type(exc).__name__}: {exc}"
            else:
                self._replicas.mark_up(base)
                if response.status_code == 200:
                    content = openai_http.chat_content(response, url)
                    self._replicas.answered(base, session)
                    return content
                last = f"{url}: HTTP {response.status_code}: {response.text[:300]!r}"
                if response.status_code == 404 and not reloaded and self._reload_adapter(base, payload):
                    reloaded = True
                    continue
                if response.status_code not in openai_http.RETRY_STATUSES:
                    raise BackendError(
                        f"the server rejected the chat request ({last}); check the model name "
                        f"{self.model!r}, the API key variable {self.api_key_env!r} and the request fields"
                    )
                retry_after = openai_http.retry_after(response.headers.get("retry-after"))
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
            failed.clear()
        raise BackendError(
            f"chat completion failed after {self.max_retries + 1} attempts over {self.base_urls}; "
            f"last error: {last}. Check that the server is up and reachable, or raise "
            "max_retries/timeout if it is slow"
        )


def _failure(first: BaseException, message: str) -> BackendError:
    """One :class:`BackendError` for failed requests, chained to the first one's error."""
    if isinstance(first, BackendError):
        error = BackendError(f"{message}; first: {first}")
    else:
        error = BackendError(f"{message}; first: {first} ({type(first).__name__})")
    error.__cause__ = first
    return error
