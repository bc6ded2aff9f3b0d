"""Virtual time for in-process tests of the runner, the engine set and the child table.

:func:`run_virtual` runs a coroutine on a :class:`VirtualClockLoop`: an ordinary selector event
loop whose ``time()`` is virtual. Whenever nothing is ready, the loop jumps straight to its next
timer instead of sleeping, so a 60 s start_timeout or a 10 s stop escalation passes in
microseconds, and every deadline is exact. Real file descriptors (the stand-ins' pipes) still
go through the real selector, polled without waiting.

"Nothing is ready" must include work sent to a thread (``asyncio.to_thread``,
``loop.run_in_executor``: the engine set loads the GPU view so): that work takes real time, and
a jump while it runs would fire a 10 s timer before a 50 ms read has come back, an order that
never happens in production. So while any such work is pending the loop waits for it in real
time and the clock stands still (trio's ``MockClock`` autojump guards the same way).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class _VirtualSelector(selectors.BaseSelector):
    """A real selector that never blocks while a timer is pending: it advances the clock --
    unless ``threads_busy()``, when only the threads' results can come next."""

    def __init__(self, advance: Callable[[float], None], threads_busy: Callable[[], bool]) -> None:
        self._inner = selectors.DefaultSelector()
        self._advance = advance
        self._threads_busy = threads_busy

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        # No timer at all, or a thread at work: only real I/O can move the test on (a thread's
        # result arrives as a write to the loop's self-pipe, which this selector watches).
        if timeout is None or self._threads_busy():
            return self._inner.select(None)
        self._advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual_now = 1000.0
        #: work sent to threads whose result has not reached the loop yet
        self._in_threads: set[asyncio.Future[Any]] = set()
        super().__init__(_VirtualSelector(self._advance, lambda: bool(self._in_threads)))

    def _advance(self, seconds: float) -> None:
        self._virtual_now += seconds

    def time(self) -> float:
        return self._virtual_now

    def run_in_executor(self, executor: Any, func: Callable[..., T],
                        *args: Any) -> asyncio.Future[T]:
        """As the base loop's (``asyncio.to_thread`` comes here too), tracked until done."""
        future = super().run_in_executor(executor, func, *args)
        self._in_threads.add(future)
        future.add_done_callback(self._in_threads.discard)
        return future

    def freeze(self, seconds: float) -> None:
        """The loop does not run for ``seconds`` (SIGSTOP, a VM pause), as from a callback
        that blocked: time jumps while nothing runs, and every timer due meanwhile fires late,
        at once, after it."""
        self._virtual_now += seconds


def run_virtual(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main()`` to its end on a fresh :class:`VirtualClockLoop`."""
    async def wrapped() -> T:
        return await main()

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(wrapped())
