"""A door's answers to monitoring reads no engine gives now: each engine's last good reply, and
which engines lag. Pure: plain methods, engine names and reply bytes.

``GetStatus`` and ``GetMetrics`` (:data:`~.doorbook.FROM_CACHE`) never wait for a restart: an
engine that cannot answer now stands in with its last good reply, however old (an engine that
never answered has none). A read waits :data:`READING_TIMEOUT` at most. In a shared door an
engine whose read ran out that time *lags*: the next reads answer without waiting on it (its
last good reply standing in) while one read of it goes on behind the callers' backs, until it
answers again. The door's relay (:mod:`cuzkd.supervisor.door.relay`) sends the reads, merges
the replies and tells the cache how each engine answered.
"""

from __future__ import annotations

from collections.abc import Sequence

from cuzkd.supervisor.core.doorbook import FROM_CACHE

#: How long a read of an engine waits before its last good reply stands in (cuzk's GetStatus
#: runs nvidia-smi: tens of milliseconds; Curio gives its own GetStatus 5 s): a shared door
#: answers by then, never at the slowest engine's pace.
READING_TIMEOUT = 2.0


def read_timeout(method: str, remaining: float | None) -> float | None:
    """How long a call sent to an engine waits for it: its caller's time ``remaining``, at
    most :data:`READING_TIMEOUT` for a read answered from cache."""
    if method in FROM_CACHE:
        return min(remaining or READING_TIMEOUT, READING_TIMEOUT)
    return remaining


class ReplyCache:
    """The last good replies and the lagging engines of one door of ``engines`` (its order)."""

    def __init__(self, engines: Sequence[str]) -> None:
        self._engines = tuple(engines)
        #: (method, engine) -> that engine's last good reply
        self._last: dict[tuple[str, str], bytes] = {}
        #: (method, engine) whose last read ran out :data:`READING_TIMEOUT`
        self._lagging: set[tuple[str, str]] = set()

    def behind(self, method: str, engines: Sequence[str]) -> list[str]:
        """Of ``engines`` asked ``method`` at once, those read behind the callers' backs (the
        lagging ones); none when all lag and none has a reply kept: then nothing answers but
        what they say now."""
        lagging = [engine for engine in engines if (method, engine) in self._lagging]
        if len(lagging) == len(engines) and not any(
                (method, engine) in self._last for engine in engines):
            return []
        return lagging

    def replied(self, method: str, engine: str, reply: bytes | None, *,
                behind: bool = False) -> None:
        """``engine`` answered ``method`` (``reply`` None: with garbage): it lags no more, and
        a good reply is kept to stand in for it. A read behind's reply is kept whatever the
        method, so a ``PreloadSRS`` read behind counts in :meth:`behind` as one kept."""
        self._lagging.discard((method, engine))
        if reply is not None and (behind or method in FROM_CACHE):
            self._last[method, engine] = reply

    def timed_out(self, method: str, engine: str) -> None:
        """``engine``'s read of ``method`` ran out its time: it lags from now on."""
        self._lagging.add((method, engine))

    def stand_ins(self, method: str) -> list[tuple[str, bytes]]:
        """The replies that answer ``method`` now: each engine's last good one, in the door's
        order; none for a method not answered from cache, or when no engine answered it yet."""
        if method not in FROM_CACHE:
            return []
        return [(engine, self._last[method, engine]) for engine in self._engines
                if (method, engine) in self._last]
