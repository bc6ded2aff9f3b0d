"""The GPU memory gate's rule: may an engine pinned to GPUs start now, and its CUDA environment.

Pure: NVML's device readings in, the reason to wait (or None) out; the waiting is
:func:`cuzkd.supervisor.engines.gpuwait.wait_for_gpus`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from cuzkd.gpus import NvmlDevice
from cuzkd.units import format_bytes


def cuda_env(gpus: Sequence[str], *, hide_others: bool = True) -> dict[str, str]:
    """The environment that pins an engine to ``gpus`` (NVML indices or UUIDs).

    NVML numbers devices in PCI bus order, CUDA by default fastest first: PCI_BUS_ID makes the
    indices an operator reads in ``nvidia-smi`` the ones CUDA uses (UUIDs need no ordering).
    ``hide_others=False`` is for cuzk, which picks its GPUs by nvidia-smi index itself (its
    ``[gpus] devices``, checked to be ``gpus``): CUDA_VISIBLE_DEVICES would renumber the
    devices under it, so ``devices = [1]`` named a CUDA device 1 that no longer exists.
    """
    order = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpus), **order} if hide_others else order


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
