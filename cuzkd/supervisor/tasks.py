"""Task ownership: every background task the supervisor starts belongs to one :class:`TaskSet`.

The composition root, each engine runner and the child table's one-shot runs start tasks that
must neither vanish unseen when they fail nor outlive their owner: a task set keeps a strong
reference to each (asyncio keeps only weak ones), logs the exception of a task that died of one,
and :meth:`TaskSet.cancel_all` cancels and awaits them all when the owner closes.
(:class:`asyncio.TaskGroup` does not fit: a failing child would cancel its siblings, and an
engine's crashed output reader must not stop its health poll.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

log = structlog.get_logger("cuzkd.supervisor")


def log_task_failure(task: asyncio.Task[Any]) -> None:
    """Done callback: log a task that died of an exception (else it would vanish unseen)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("task_failed", task=task.get_coro().__qualname__,  # type: ignore[union-attr]
                  error=repr(exc), exc_info=exc)


class TaskSet:
    """The tasks one owner started and still runs."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task owned by this set (dropped from it once done)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(log_task_failure)
        return task

    async def wait(self) -> None:
        """Wait until every task has ended, those started meanwhile too (failures are logged,
        not raised). A waiter cancelled meanwhile leaves the tasks running (``asyncio.wait``;
        ``gather`` would cancel them with it)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def cancel_all(self) -> None:
        """Cancel every task and wait until all have ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
