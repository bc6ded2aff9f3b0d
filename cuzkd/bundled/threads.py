"""The bundled engine's thread pools: array work runs off the event loop (NumPy and CuPy
release the GIL), so the loop keeps answering the API while partitions are proved."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

_T = TypeVar("_T")


class ThreadPools:
    """One pool per phase, so a phase never waits for a thread another phase holds."""

    def __init__(self, synthesis_threads: int, device_threads: int) -> None:
        """``device_threads``: one per GPU worker, each of which has one device call at a time."""
        self.synthesis = ThreadPoolExecutor(synthesis_threads, "synth")
        self.device = ThreadPoolExecutor(device_threads, "device")
        self.finalize = ThreadPoolExecutor(2, "finalize")

    async def shutdown(self) -> None:
        """Wait for the running calls to end; queued ones never start."""
        for pool in (self.synthesis, self.device, self.finalize):
            await asyncio.to_thread(pool.shutdown, True, cancel_futures=True)


async def run_in(pool: ThreadPoolExecutor, fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` on a thread of ``pool``, awaited on the loop."""
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
