"""The bundled engine's drain (docs/engine.md): intake closes, and every job already accepted is
finished -- a client that got 202 must get its proof -- until the drain's deadline or an
explicit cut; what is still open then ends ``failed`` with :data:`DRAIN_TIMEOUT`, so no accepted
job ever vanishes without a state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cuzkd.bundled.jobbook import JobBook

#: The error of a job still open when a drain ended (its deadline, or a stop signal).
DRAIN_TIMEOUT = "drain timeout"


class Drain:
    """One drain per engine: begun once, ended by the last open job, its deadline or a cut."""

    def __init__(self, book: JobBook, *, clock: Callable[[], float],
                 expire: Callable[[str], None]) -> None:
        """``expire``: fails what is still open, with the error it is given, when the drain
        ends before it finished."""
        self._book = book
        self._clock = clock
        self._expire = expire
        self._task: asyncio.Task[bool] | None = None
        self._begun = asyncio.Event()
        self._cut = asyncio.Event()
        self._deadline: float | None = None

    @property
    def begun(self) -> bool:
        return self._task is not None

    @property
    def task(self) -> asyncio.Task[bool] | None:
        """The drain's task once begun: True when every accepted job finished."""
        return self._task

    def begin(self, timeout_secs: float) -> None:
        """Start waiting for the open jobs, for ``timeout_secs`` at most."""
        self._deadline = self._clock() + timeout_secs
        self._task = asyncio.create_task(self._wait(timeout_secs), name="drain")
        self._begun.set()

    def cut(self) -> None:
        """End the drain now: what is still open fails with :data:`DRAIN_TIMEOUT`."""
        self._cut.set()

    def remaining_secs(self) -> float | None:
        """Seconds left until the drain's deadline; None when not draining."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._clock())

    async def ended(self) -> bool:
        """Wait for the drain to be begun and to end; True when every accepted job finished."""
        await self._begun.wait()
        assert self._task is not None
        return await asyncio.shield(self._task)

    async def _wait(self, timeout_secs: float) -> bool:
        idle = asyncio.create_task(self._book.all_finished())
        cut = asyncio.create_task(self._cut.wait())
        try:
            await asyncio.wait((idle, cut), timeout=timeout_secs,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (idle, cut):
                task.cancel()
        if self._book.open_jobs == 0:
            return True
        self._expire(DRAIN_TIMEOUT)
        return False
