"""The bytes all responses of the metrics listener together may hold: bodies in flight and
their unsent slices.

A response holds its body until its last byte is sent, and a slice of it (at most) waits in
the connection's transport buffer while the client does not read
(:mod:`cuzkd.supervisor.web.outbox`). Responses of one document version share one body, but
every version is a new one: 2,000 clients that each read a byte now and then, each on another
version of an 8 MB ``/status``, would keep 2,000 bodies alive. This budget bounds the sum --
each body counted once, however many responses send it, plus every waiting slice -- whatever
the number of connections: when a response's start or a new wait takes the total over
``limit``, the responses that made progress longest ago are evicted (their caller closes
them) until it fits. A response makes progress when a slice of it leaves for the kernel: a
client that reads, even slowly, is always among the youngest; one that never reads sinks to
the oldest end and is the first to go. The response that asks is never evicted for its own
start or wait (so one body larger than ``limit`` is still sent, alone).

Pure: keys are whatever the caller uses for a response (its transport), bodies whatever
identifies a body (``id()`` of the bytes while the caller holds them).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class _Body:
    size: int
    senders: int


class SendBudget(Generic[K]):
    """Responses in flight, the one that progressed longest ago first; the bytes they hold at
    most ``limit`` after every :meth:`start` and :meth:`hold` (unless one alone is larger)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: response -> its body's identity; insertion order is the order of last progress
        self._body_of: dict[K, Hashable] = {}
        self._waiting: dict[K, int] = {}
        self._bodies: dict[Hashable, _Body] = {}
        #: bodies in flight (each once) plus every waiting slice
        self.held = 0

    def start(self, key: K, body: Hashable, size: int) -> list[K]:
        """``key`` begins to send ``body`` (``size`` bytes; counted once for all who send the
        same ``body``); the responses evicted to stay within ``limit``, already forgotten."""
        self.finish(key)
        entry = self._bodies.get(body)
        if entry is None:
            entry = self._bodies[body] = _Body(size, 0)
            self.held += size
        entry.senders += 1
        self._body_of[key] = body
        return self._fit(key)

    def hold(self, key: K, nbytes: int) -> list[K]:
        """``key`` (started) progressed and now has ``nbytes`` waiting (replacing what it had
        waiting); the responses evicted to stay within ``limit``, oldest first. Nothing for
        a ``key`` not in flight (evicted, or finished)."""
        body = self._body_of.pop(key, None)
        if body is None:
            return []
        self.release(key)
        self._body_of[key] = body  # the youngest now
        self._waiting[key] = nbytes
        self.held += nbytes
        return self._fit(key)

    def release(self, key: K) -> None:
        """``key`` has nothing waiting any more (its slice left for the kernel)."""
        self.held -= self._waiting.pop(key, 0)

    def finish(self, key: K) -> None:
        """``key``'s response ended (sent, or its connection closed): its body and slice go."""
        self.release(key)
        body = self._body_of.pop(key, None)
        if body is None:
            return
        entry = self._bodies[body]
        entry.senders -= 1
        if not entry.senders:
            del self._bodies[body]
            self.held -= entry.size

    def _fit(self, asker: K) -> list[K]:
        evicted: list[K] = []
        for oldest in list(self._body_of):
            if self.held <= self.limit or oldest == asker:
                break
            self.finish(oldest)
            evicted.append(oldest)
        return evicted

    def __len__(self) -> int:
        return len(self._body_of)
