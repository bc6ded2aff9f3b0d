"""The GPU memory gate: start an engine only once its GPUs can hold it.

A replacement started before the old process's device memory is released fails with
out-of-memory at start-up (and, under ``restart = "always"``, crash-loops until the driver
catches up). Before starting an engine pinned to GPUs (``gpus``), the runner waits until, on
each of those GPUs, no process of the previous one (``dead_pids``) holds device memory, and
free memory covers ``gpu_memory_needed`` -- at most ``gpu_release_timeout``, then it starts
anyway (the engine's own error is better than never starting) and says so.

:func:`blocker` is the pure rule; :func:`wait_for_gpus` polls a
:class:`~cuzkd.gpus.GpuView` with an injectable clock and sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from cuzkd.gpus import GpuView, GpuViewError, NvmlDevice
from cuzkd.units import format_bytes

#: How often the gate re-reads NVML while it waits (seconds).
POLL_INTERVAL = 0.25


def cuda_env(gpus: Sequence[str]) -> dict[str, str]:
    """The environment that pins an engine to ``gpus`` (NVML indices or UUIDs).

    NVML numbers devices in PCI bus order, CUDA by default fastest first: PCI_BUS_ID makes the
    indices an operator reads in ``nvidia-smi`` the ones CUDA uses (UUIDs need no ordering).
    """
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def blocker(devices: Sequence[NvmlDevice], wanted: Sequence[str], dead_pids: Collection[int],
            needed: int) -> str | None:
    """Why the engine cannot start yet, or None when every wanted GPU is ready."""
    for want in wanted:
        device = next((d for d in devices if d.matches(want)), None)
        if device is None:
            return f"GPU {want!r} not found by NVML"
        holders = sorted(pid for pid in device.processes if pid in dead_pids)
        if holders:
            held = sum(device.processes[pid] or 0 for pid in holders)
            return (f"GPU {device.index} still holds {format_bytes(held)} of the previous "
                    f"process (pid {', '.join(map(str, holders))})")
        free = device.memory_total_bytes - device.memory_used_bytes
        if free < needed:
            return (f"GPU {device.index} has {format_bytes(free)} free, "
                    f"{format_bytes(needed)} needed")
    return None


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
