"""A task that has run up to its first ``await``: the ordering a test can wait for.

``asyncio.create_task(coro)`` followed by ``await asyncio.sleep(0)`` lets the task take its
first step only because of how the loop happens to schedule one turn. A test that needs "the
waiter is queued", "the scrape has taken its list of engines" or "the one-shot has spawned"
awaits :func:`started` instead: it returns once the task has run until it first waits (or has
finished), whatever else is scheduled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def started(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Run ``coro`` as a task; return the task once it has run to its first suspension."""
    stepped = asyncio.Event()

    async def run() -> T:
        stepped.set()  # the waiter wakes only after this step, which goes on into ``coro``
        return await coro

    task = asyncio.create_task(run())
    await stepped.wait()
    return task
