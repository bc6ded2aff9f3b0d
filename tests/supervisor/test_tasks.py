"""TaskSet, the one owner of background tasks: strong references, failures logged, wait and
cancel-and-await."""

from __future__ import annotations

import asyncio

import structlog
from support.started import started

from cuzkd.supervisor.tasks import TaskSet


async def test_a_failing_task_is_logged_and_dropped() -> None:
    tasks = TaskSet()

    async def boom() -> None:
        raise RuntimeError("lost pipe")

    with structlog.testing.capture_logs() as logs:
        tasks.start(boom())
        # Done callbacks run in the order they were added: the set's own (drop it, log its
        # failure) before the one by which wait() learns that the task ended.
        await tasks.wait()
    [failed] = [e for e in logs if e["event"] == "task_failed"]
    assert "lost pipe" in failed["error"] and "boom" in failed["task"]
    assert len(tasks) == 0


async def test_wait_covers_tasks_started_meanwhile_and_cancel_all_ends_the_rest() -> None:
    tasks = TaskSet()
    done: list[str] = []
    release = asyncio.Event()

    async def second() -> None:
        await release.wait()
        done.append("second")

    async def first() -> None:
        tasks.start(second())
        done.append("first")
        release.set()

    tasks.start(first())
    await tasks.wait()
    assert done == ["first", "second"] and len(tasks) == 0

    forever = tasks.start(asyncio.Event().wait())  # type: ignore[arg-type]
    await tasks.cancel_all()
    assert forever.cancelled() and len(tasks) == 0


async def test_a_waiter_cancelled_leaves_the_tasks_running() -> None:
    """A spawn waiting for an engine's leftovers to be stopped is dropped by a stop request;
    the leftovers' stop must go on."""
    tasks = TaskSet()
    release = asyncio.Event()

    async def sweep() -> None:
        await release.wait()

    swept = tasks.start(sweep())
    waiter = await started(tasks.wait())  # the waiter is waiting
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert not swept.done()
    release.set()
    await tasks.wait()
    assert swept.done() and not swept.cancelled()
