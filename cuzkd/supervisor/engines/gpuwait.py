"""The GPU memory gate: start an engine only once its GPUs can hold it.

A replacement started before the old process's device memory is released fails with
out-of-memory at start-up (and, under ``restart = "always"``, crash-loops until the driver
catches up). Before starting an engine pinned to GPUs (``gpus``), the runner waits until, on
each of those GPUs, no process of the previous one (``dead_pids``) holds device memory, and
free memory covers ``gpu_memory_needed`` -- at most ``gpu_release_timeout``, then it starts
anyway (the engine's own error is better than never starting) and says so.

:func:`~cuzkd.supervisor.core.gpugate.blocker` is the pure rule; :func:`wait_for_gpus` polls a
:class:`~cuzkd.gpus.GpuView` with an injectable clock and sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from cuzkd.errors import GpuViewError
from cuzkd.gpus import GpuView, NvmlDevice
from cuzkd.supervisor.core.gpugate import blocker

#: How often the gate re-reads NVML while it waits (seconds).
POLL_INTERVAL = 0.25


@dataclass(frozen=True)
class GateResult:
    ready: bool
    waited_seconds: float
    #: the last reason to wait (None when ready)
    reason: str | None
    #: NVML reads made: 1 when the GPUs were ready at once
    reads: int


async def wait_for_gpus(view: GpuView, wanted: Sequence[str], dead_pids: Collection[int],
                        needed: int, timeout: float, *,
                        read: Callable[[GpuView], Awaitable[Sequence[NvmlDevice]]] | None = None,
                        clock: Callable[[], float] = time.monotonic,
                        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                        interval: float = POLL_INTERVAL) -> GateResult:
    """Poll until :func:`blocker` clears or ``timeout`` passes. ``read`` reads the devices
    (default: in a thread, NVML may block)."""
    read_devices = read or _read_in_thread
    start = clock()
    reads = 0
    while True:
        reads += 1
        try:
            reason = blocker(await read_devices(view), wanted, dead_pids, needed)
        except GpuViewError as exc:
            reason = str(exc)
        waited = clock() - start
        if reason is None:
            return GateResult(True, waited, None, reads)
        if waited >= timeout:
            return GateResult(False, waited, reason, reads)
        await sleep(min(interval, timeout - waited))


async def _read_in_thread(view: GpuView) -> Sequence[NvmlDevice]:
    return await asyncio.to_thread(view.devices)
