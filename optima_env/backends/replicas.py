"""Which replica serves a request: sticky sessions, failover and cool-down over several servers.

:class:`ReplicaSet` is the bookkeeping of :class:`~optima_env.backends.openai.OpenAIChatPolicy`
over its base URLs; it sends nothing itself.

* **Sticky sessions.** A request with a ``session`` (its conversation) goes to the session's
  replica, so that the server's prefix cache holds the conversation's earlier turns. The replica
  is chosen by rendezvous hashing (highest random weight: Thaler & Ravishankar, "Using name-based
  mappings to increase hit rates", IEEE/ACM ToN 6(1), 1998): each replica gets the score
  ``crc32(session, replica)`` and the highest live one wins. A replica that goes down moves only its
  own sessions (each to its next-highest live replica); every other session keeps its server.
  A moved session stays where it moved, also after its first replica comes back (that server's
  cache no longer holds it); it moves again only if its new replica fails too.
* **Sessionless requests** (``session == ()``) rotate round robin over the live replicas.
* **Failover.** A replica that refuses or drops connections is out for ``cooldown`` seconds (one
  warning naming it); after that one request tries it again.

Hand-written because the mapping is a few lines over ``zlib.crc32`` and must stay stable across
processes and runs (Python's ``hash`` of a tuple is salted per process for strings).
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Sequence

__all__ = ["ReplicaSet"]

logger = logging.getLogger("optima_env.backends.openai")


class ReplicaSet:
    """The live/down state of several base URLs and where each session's requests go.

    Args:
        urls: the base URLs (at least one, without a trailing ``/``).
        cooldown: seconds a replica that refused or dropped a connection stays out.
    """

    def __init__(self, urls: Sequence[str], cooldown: float) -> None:
        self.urls = list(urls)
        self.cooldown = cooldown
        self._down_until: dict[str, float] = {}  # replica -> monotonic time it may be tried again
        self._moved: dict[tuple[object, ...], str] = {}  # session -> replica it failed over to
        self._replies: dict[str, int] = dict.fromkeys(self.urls, 0)
        self._placements: dict[tuple[object, ...], list[str]] = {}
        self._lock = threading.Lock()

    # -- state ----------------------------------------------------------------------------------
    def live(self) -> list[str]:
        """The replicas in the rotation now (those not cooling down after a dropped connection)."""
        now = time.monotonic()
        with self._lock:
            return [u for u in self.urls if self._down_until.get(u, 0.0) <= now]

    def replies(self) -> dict[str, int]:
        """Successful replies per replica so far."""
        with self._lock:
            return dict(self._replies)

    def placements(self) -> dict[tuple[object, ...], tuple[str, ...]]:
        """Session -> the replicas that answered its requests, in the order they first did (one
        replica per session unless its replica failed), since :meth:`forget_sessions`."""
        with self._lock:
            return {s: tuple(r) for s, r in self._placements.items()}

    def forget_sessions(self) -> None:
        """Drop the failover moves and placements (the conversations are over, e.g. a new stage)."""
        with self._lock:
            self._moved.clear()
            self._placements.clear()

    # -- choice ---------------------------------------------------------------------------------
    def home(self, session: tuple[object, ...], among: Sequence[str] | None = None) -> str:
        """The replica of ``session`` by rendezvous hashing over ``among`` (default: all)."""
        candidates = self.urls if among is None else among
        name = repr(session)
        return max(candidates, key=lambda url: (zlib.crc32(f"{name}@{url}".encode()), url))

    def pick(self, session: tuple[object, ...], turn: int, exclude: Sequence[str] = ()) -> str:
        """The replica for one attempt: the session's (sticky), else the ``turn``-th live one.

        ``exclude`` lists replicas this request just failed on (they are out of the live set
        already unless their cool-down is 0). When every replica is out, the session's own (or the
        rotation's) replica is tried anyway, and the caller retries with backoff."""
        live = self.live()
        usable = [u for u in live if u not in exclude] or live
        if not session:
            pool = usable or self.urls
            return pool[turn % len(pool)]
        with self._lock:
            current = self._moved.get(session) or self.home(session)
            if current in usable or not usable:
                return current
            moved = self.home(session, usable)  # its replica failed: the next one in its ranking
            self._moved[session] = moved
        return moved

    # -- events ---------------------------------------------------------------------------------
    def answered(self, url: str, session: tuple[object, ...]) -> None:
        """``url`` answered a request of ``session`` (recorded for :meth:`placements`)."""
        with self._lock:
            self._replies[url] = self._replies.get(url, 0) + 1
            if session:
                seen = self._placements.setdefault(session, [])
                if url not in seen:
                    seen.append(url)

    def mark_down(self, url: str, error: str) -> bool:
        """Take ``url`` out of the rotation; True when another replica is left to fail over to."""
        with self._lock:
            new = url not in self._down_until
            self._down_until[url] = time.monotonic() + self.cooldown
        others = [u for u in self.live() if u != url]
        if new:
            logger.warning(
                "replica %s is out of the rotation for %gs: %s; sending its requests to %s",
                url,
                self.cooldown,
                error,
                ", ".join(others) if others else "no other replica (every one is out: retrying with backoff)",
            )
        return bool(others)

    def mark_up(self, url: str) -> None:
        """``url`` answered: back in the rotation if it was out (logged)."""
        with self._lock:
            if self._down_until.pop(url, None) is None:
                return
        logger.info("replica %s answers again; back in the rotation", url)
