"""The drain on its own: its deadline on the engine's clock, its end by the last open job or
by a cut, what is still open failed with DRAIN_TIMEOUT."""

from __future__ import annotations

import asyncio

from cuzkd.bundled.budget import MemoryBudget
from cuzkd.bundled.drain import DRAIN_TIMEOUT, Drain
from cuzkd.bundled.jobbook import JobBook
from cuzkd.priority import Priority
from cuzkd.status.tracker import StatusTracker


def book_of(now: list[float]) -> JobBook:
    budget = MemoryBudget(2**20)
    return JobBook(StatusTracker(budget=budget), budget, clock=lambda: now[0],
                   publish=lambda: None, retain_jobs=10)


async def test_a_drain_ends_once_the_last_open_job_finished() -> None:
    now = [50.0]
    book = book_of(now)
    job = book.accept("winning-post", 1, 10, "", Priority.NORMAL, 0.0)
    expired: list[str] = []
    drain = Drain(book, clock=lambda: now[0], expire=expired.append)
    assert drain.remaining_secs() is None and not drain.begun
    drain.begin(30.0)
    now[0] = 60.0
    assert drain.begun and drain.remaining_secs() == 20.0
    now[0] = 90.0
    assert drain.remaining_secs() == 0.0
    job.admitted = 1
    book.partition_ended(job)
    assert await asyncio.wait_for(drain.ended(), 5) and expired == []


async def test_a_cut_drain_fails_what_is_open_with_drain_timeout() -> None:
    book = book_of([0.0])
    book.accept("winning-post", 1, 10, "", Priority.NORMAL, 0.0)
    expired: list[str] = []
    drain = Drain(book, clock=lambda: 0.0, expire=expired.append)
    drain.begin(3600.0)
    drain.cut()
    assert not await asyncio.wait_for(drain.ended(), 5)
    assert expired == [DRAIN_TIMEOUT]
