"""The host-memory budget: two-phase reservations, granted first-come first-served.

Like cuzk's unified budget, every partition reserves its host memory *before* synthesis
allocates it, for its whole working set: part of the reservation (synthesis scratch) is
returned when synthesis ends, the rest (witness, the GPU phase's working set, results) once the
partition is finalized. Cached tables (the NTT plans) are reserved the same way but *pinned*:
they stay for the engine's life, so what is left for partitions shrinks by them. A request that
can never fit -- larger than the budget less what is pinned -- fails at once instead of waiting
forever, and so does a waiter that a later pin made impossible.

:class:`Ledger` is the pure accounting (no asyncio, unit-tested directly);
:class:`MemoryBudget` adds asynchronous waiting on top of it with a FIFO of waiters, so a large
request is not starved by a stream of small ones. ``MemoryBudget`` implements the status
tracker's ``MemoryBudgetView``. All mutation happens on the event loop thread; the tracker's
reads of two ints from other threads need no lock.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from cuzkd.errors import BudgetExceededError


@dataclass
class Reservation:
    synth_bytes: int
    rest_bytes: int

    @property
    def total(self) -> int:
        return self.synth_bytes + self.rest_bytes


@dataclass
class Ledger:
    """Pure accounting of reservations keyed by partition."""

    total_bytes: int
    #: size of a typical partition reservation, for ``max_concurrent_synthesis``
    nominal_request: int = 1
    used_bytes: int = 0
    #: bytes of reservations held for good (cached tables); part of ``used_bytes``
    pinned_bytes: int = 0
    held: dict[Hashable, Reservation] = field(default_factory=dict)

    def check(self, request: Reservation) -> None:
        available = self.total_bytes - self.pinned_bytes
        if request.total > available:
            pinned = (f" ({self.pinned_bytes} of it held by cached tables)"
                      if self.pinned_bytes else "")
            raise BudgetExceededError(
                f"partition needs {request.total} bytes of host memory but the whole budget is "
                f"{self.total_bytes} bytes{pinned}"
            )

    def fits(self, request: Reservation) -> bool:
        return self.used_bytes + request.total <= self.total_bytes

    def grant(self, key: Hashable, request: Reservation, *, pinned: bool = False) -> None:
        """Hold ``request`` for ``key``; ``pinned``: for good (never released)."""
        self.check(request)
        if key in self.held:
            raise KeyError(f"reservation {key!r} already held")
        if not self.fits(request):
            raise RuntimeError(f"reservation {key!r} does not fit")
        self.used_bytes += request.total
        if pinned:
            self.pinned_bytes += request.total
            return
        self.held[key] = Reservation(request.synth_bytes, request.rest_bytes)
        self.nominal_request = request.total

    def release_synth(self, key: Hashable) -> int:
        """Return the synthesis part; the rest stays held. Returns bytes freed."""
        held = self.held[key]
        freed, held.synth_bytes = held.synth_bytes, 0
        self.used_bytes -= freed
        return freed

    def release(self, key: Hashable) -> int:
        """Return everything still held for ``key`` (idempotent). Returns bytes freed."""
        held = self.held.pop(key, None)
        if held is None:
            return 0
        self.used_bytes -= held.total
        return held.total

    def max_concurrent(self) -> int:
        return (self.total_bytes - self.pinned_bytes) // max(1, self.nominal_request)


class MemoryBudget:
    """Asynchronous FIFO front of a :class:`Ledger`; a ``MemoryBudgetView``."""

    def __init__(self, total_bytes: int, nominal_request: int = 1) -> None:
        self._ledger = Ledger(total_bytes=total_bytes, nominal_request=nominal_request)
        self._waiters: deque[tuple[Hashable, Reservation, bool, asyncio.Future[None]]] = deque()

    # MemoryBudgetView
    def total_bytes(self) -> int:
        return self._ledger.total_bytes

    def used_bytes(self) -> int:
        return self._ledger.used_bytes

    def max_concurrent_synthesis(self) -> int:
        return self._ledger.max_concurrent()

    def pinned_bytes(self) -> int:
        """Bytes held for good (cached tables): ``used_bytes()`` never drops below this."""
        return self._ledger.pinned_bytes

    def check(self, synth_bytes: int, rest_bytes: int) -> None:
        """:class:`BudgetExceededError` if such a reservation could never be granted."""
        self._ledger.check(Reservation(synth_bytes, rest_bytes))

    async def acquire(self, key: Hashable, synth_bytes: int, rest_bytes: int, *,
                      pinned: bool = False) -> None:
        """Reserve, waiting while the budget is full; :class:`BudgetExceededError` at once if
        the request can never fit (or once a pin made it impossible while it waited).
        ``pinned``: held for good, never released. Cancel-safe: a cancelled waiter holds
        nothing."""
        request = Reservation(synth_bytes, rest_bytes)
        self._ledger.check(request)
        if not self._waiters and self._ledger.fits(request):
            self._ledger.grant(key, request, pinned=pinned)
            self._grant_waiters()  # a pin may have made a waiter impossible
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (key, request, pinned, future)
        self._waiters.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(key)  # granted just as we were cancelled
            else:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                self._grant_waiters()  # the head may have been blocking smaller ones
            raise

    def release_synth(self, key: Hashable) -> None:
        self._ledger.release_synth(key)
        self._grant_waiters()

    def release(self, key: Hashable) -> None:
        self._ledger.release(key)
        self._grant_waiters()

    def _grant_waiters(self) -> None:
        while self._waiters:
            key, request, pinned, future = self._waiters[0]
            if future.cancelled():  # its task has not run its cleanup yet
                self._waiters.popleft()
                continue
            try:
                self._ledger.check(request)
            except BudgetExceededError as exc:  # pinned tables left it no room, ever
                self._waiters.popleft()
                future.set_exception(exc)
                continue
            if not self._ledger.fits(request):
                return
            self._waiters.popleft()
            self._ledger.grant(key, request, pinned=pinned)
            future.set_result(None)
