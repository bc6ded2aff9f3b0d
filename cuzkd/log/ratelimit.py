"""Rate limiting for repeated log events: one line per key per interval, with a count.

A fault that repeats on every loop turn (``accept`` failing with ``EMFILE``, a status fetch
refused every 100 ms, a spawn failing on each backoff) once wrote hundreds of thousands of
identical lines in seconds, which hid the cause and filled the disk. Such events go through a
:class:`RateLimiter`: the first occurrence of a key is logged at once, later ones within the
interval are only counted, and the next line logged for that key says how many occurrences it
stands for (``repeated=N``, N >= 1). The tail of a burst is therefore reported with the next
occurrence, never lost silently as a count; nothing is logged when nothing happens.

The limiter is pure logic with an injected clock (unit-tested without sleeping);
:class:`LimitedLog` is the thin glue that writes the structured line.
"""

from __future__ import annotations

import errno as errno_codes
import time
from collections.abc import Callable, Hashable
from typing import Any

#: Default interval between two lines for one key.
INTERVAL = 10.0
#: Keys remembered at most (the oldest are forgotten first); keys are bounded in practice
#: (event x engine x errno), this only guards against a caller passing unbounded ones.
MAX_KEYS = 4096


class RateLimiter:
    """Admits one occurrence per key per ``interval`` seconds of ``clock``."""

    def __init__(self, interval: float = INTERVAL, *, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = MAX_KEYS) -> None:
        self.interval = interval
        self._clock = clock
        self._max_keys = max_keys
        #: key -> (time of the last admitted occurrence, occurrences since then)
        self._seen: dict[Hashable, tuple[float, int]] = {}

    def hit(self, key: Hashable) -> int | None:
        """Record one occurrence of ``key``.

        Returns None when it should not be logged, else how many occurrences the line to log
        stands for: this one plus those suppressed since the key was last admitted.
        """
        now = self._clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.interval:
            self._seen[key] = (last[0], last[1] + 1)
            return None
        self._seen.pop(key, None)  # re-inserted last: the dict stays ordered by admission
        if len(self._seen) >= self._max_keys:
            del self._seen[next(iter(self._seen))]
        self._seen[key] = (now, 0)
        return 1 if last is None else last[1] + 1


class LimitedLog:
    """Writes structured log events through a :class:`RateLimiter`.

    The key is the event name plus ``key`` (typically the engine and the errno); the line gets
    ``repeated=N``. One instance is meant to be shared by everything that logs the same events.
    """

    def __init__(self, limiter: RateLimiter | None = None) -> None:
        self.limiter = limiter if limiter is not None else RateLimiter()

    def log(self, logger: Any, level: str, event: str, /, *, key: Hashable = (),
            **fields: Any) -> bool:
        """Log ``event`` at ``level`` on ``logger`` unless rate-limited; True when written."""
        repeated = self.limiter.hit((event, key))
        if repeated is None:
            return False
        getattr(logger, level)(event, repeated=repeated, **fields)
        return True


def errno_name(exc: BaseException) -> str:
    """A short, bounded key for an error: its errno name (``EMFILE``) or its type name."""
    code = getattr(exc, "errno", None)
    if isinstance(code, int):
        return errno_codes.errorcode.get(code, str(code))
    return type(exc).__name__
