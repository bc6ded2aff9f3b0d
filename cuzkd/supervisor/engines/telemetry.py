"""The telemetry poll of one cuzk engine's gRPC: ``GetStatus`` and ``GetMetrics`` at a fixed,
slow cadence, the last answer kept for the scrapes.

Why a cadence of its own, not a read per scrape: the real cuzk runs ``nvidia-smi`` for every
``GetStatus`` (tens of milliseconds of the engine's CPU), so what the engine pays must not grow
with the number of Prometheus servers or their scrape interval; and a scrape never waits on
the engine's gRPC.

The cadence is the engine's ``grpc_telemetry_interval`` (10 s by default: one poll costs the
engine at most about 0.5 % of one core at 50 ms a call; docs/benchmarks.md measures it).

A poll that fails (nothing listening, a hang past the timeout, a reset, a reply too large or
garbled, a ``GetMetrics`` text that is not exposition) counts its bounded reason, logs one line
per reason per 10 s, and drops what it could not read: that engine's gRPC series go until an
answer comes. Nothing listening before a process's gRPC first answered, within its
``start_timeout``, is its start, not counted (cuzk binds ``/status`` first). It is not a health
failure (``/status`` is the engine's health), and nothing else waits on it. Polls run only while
the engine is ``running``: an engine still starting or stopping is not expected to answer, and
its last answer is not exported then.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from structlog.typing import FilteringBoundLogger

from cuzkd.cuzk.client import read_telemetry
from cuzkd.cuzk.telemetry import UNAVAILABLE, Telemetry
from cuzkd.log.ratelimit import LimitedLog


class GrpcTelemetry:
    """Polls one engine's gRPC address; :attr:`latest` is what the scrapes export."""

    def __init__(self, address: str, timeout: float, interval: float, start_grace: float,
                 clock: Callable[[], float], log: FilteringBoundLogger,
                 limited: LimitedLog) -> None:
        """``start_grace``: seconds from a process's first poll during which nothing
        listening is its start (cuzk binds ``/status`` before its gRPC listener)."""
        self._address = address
        self._timeout = timeout
        self._interval = interval
        self._start_grace = start_grace
        self._clock = clock
        self._log = log
        self._limited = limited
        #: the last poll's answer, None when it failed or none is current
        self.latest: Telemetry | None = None
        #: reason -> methods of polls that told nothing
        self.errors_total: Counter[str] = Counter()
        #: when the current process was first polled, and whether its gRPC answered since
        self._first_poll: float | None = None
        self._answered = False

    async def poll(self) -> None:
        """One poll: its answer kept (or dropped), its failures counted and logged -- but
        nothing listening yet, within ``start_grace`` of the process's first poll and before
        it ever answered, is its start, as for ``/status``."""
        reading = await read_telemetry(self._address, self._timeout)
        now = self._clock()
        if self._first_poll is None:
            self._first_poll = now
        starting = not self._answered and now - self._first_poll < self._start_grace
        for failure in reading.failures:
            if starting and failure.reason == UNAVAILABLE:
                continue
            self.errors_total[failure.reason] += 1
            self._limited.log(self._log, "warning", "engine_grpc_telemetry_failed",
                              key=failure.reason, reason=failure.reason, error=failure.message)
        self._answered |= reading.queues is not None
        self.latest = reading if reading.queues is not None else None

    async def run(self, running: Callable[[], bool], alive: Callable[[], bool]) -> None:
        """Poll every interval while ``running()``, for as long as ``alive()`` (the scrapes
        export the answer only while the engine is running)."""
        while alive():
            if running():
                await self.poll()
            await asyncio.sleep(self._interval)

    def forget(self) -> None:
        """The process ended: what it said is no longer true, and the next one starts."""
        self.latest = None
        self._first_poll, self._answered = None, False
