"""Waiting for a condition in tests that run real processes: poll it against a deadline.

A test never sleeps a fixed time hoping something has happened: it names the condition and
how long it may take, and fails saying what it waited for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def until(predicate: Callable[[], Any], what: str, timeout: float = 20.0,
                interval: float = 0.01) -> Any:
    """:func:`wait_until` for a test on an event loop: the predicate is polled on the loop
    (it reads the loop's own state), which runs on between polls."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
