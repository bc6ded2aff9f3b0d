"""The virtual clock of the in-process tests (tests/support/virtual_clock.py): it jumps over
idle time, and stands still while work sent to a thread runs in real time."""

from __future__ import annotations

import asyncio
import time

from support.virtual_clock import run_virtual


def test_idle_time_passes_at_once_and_exactly() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(600)
        return loop.time() - start

    began = time.monotonic()
    assert run_virtual(main) == 600
    assert time.monotonic() - began < 5


def test_a_timer_does_not_fire_while_work_sent_to_a_thread_is_pending() -> None:
    """50 ms of real work in a thread ends before a 10 s timer: the clock must not jump to the
    timer while nothing but the thread is running (it would in a loop blind to threads)."""
    async def main() -> tuple[list[str], float]:
        loop = asyncio.get_running_loop()
        order: list[str] = []
        loop.call_later(10, order.append, "timer")
        start = loop.time()
        await asyncio.to_thread(time.sleep, 0.05)
        order.append("thread")
        in_thread = loop.time() - start
        await asyncio.sleep(10)
        return order, in_thread

    order, in_thread = run_virtual(main)
    assert order == ["thread", "timer"]
    assert in_thread == 0


def test_run_in_executor_is_waited_for_too() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        order: list[str] = []
        loop.call_later(1, order.append, "timer")
        await loop.run_in_executor(None, time.sleep, 0.05)
        order.append("executor")
        await asyncio.sleep(1)
        return order

    assert run_virtual(main) == ["executor", "timer"]
