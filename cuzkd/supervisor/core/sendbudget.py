"""The bytes all responses of the metrics listener together may leave unsent in cuzkd's memory.

A response is written in slices (:mod:`cuzkd.supervisor.web.outbox`); a slice the kernel did
not take at once waits in the connection's transport buffer until the client reads. One slice
per connection bounds each connection, but not all of them: 2,000 clients that send
``GET /status`` and never read would hold 2,000 slices. This budget bounds the sum whatever
the number of connections: when a new wait would take the total over ``limit``, the
connections whose bytes have waited longest are evicted (their caller closes them) until it
fits. A client that reads, however slowly, keeps freeing its slice and taking a new one, so it
is always among the youngest holders; a client that never reads sinks to the oldest end and
is the first to go. The connection that asks is never evicted for its own wait (``limit``
is at least one slice).

Pure: keys are whatever the caller uses for a connection (its transport).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class SendBudget(Generic[K]):
    """Unsent bytes by holder, oldest holder first; their sum at most ``limit`` after
    every :meth:`hold`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: holder -> bytes it has waiting; insertion order is the order they began to wait
        self._held: dict[K, int] = {}
        self.held = 0

    def hold(self, key: K, nbytes: int) -> list[K]:
        """``key`` now has ``nbytes`` waiting (replacing what it held, and making it the
        youngest holder); the holders evicted to stay within ``limit``, oldest first, already
        forgotten."""
        self.release(key)
        self._held[key] = nbytes
        self.held += nbytes
        evicted: list[K] = []
        for oldest in list(self._held):
            if self.held <= self.limit or oldest == key:
                break
            self.release(oldest)
            evicted.append(oldest)
        return evicted

    def release(self, key: K) -> None:
        """``key`` has nothing waiting any more (its bytes left, or it closed)."""
        self.held -= self._held.pop(key, 0)

    def __len__(self) -> int:
        return len(self._held)
