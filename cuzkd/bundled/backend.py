"""Choosing the array module and describing the devices it computes on.

CuPy is used when it imports *and* sees at least one CUDA device; otherwise NumPy, with one
CPU pseudo-device (ordinal 0) so the pipeline keeps the same shape everywhere. CuPy is
imported lazily, inside :func:`select_backend`, so start-up stays fast and machines without it
never pay for the import.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuzkd.bundled.field import ArrayModule
from cuzkd.errors import BackendError
from cuzkd.status.document import GpuDevice


class BackendName(enum.StrEnum):
    """Where the bundled engine computes (``backend``); a selected :class:`Backend` is never
    ``auto``."""

    #: CuPy when it and a CUDA device are there, else NumPy
    AUTO = "auto"
    NUMPY = "numpy"
    CUPY = "cupy"


@dataclass(frozen=True)
class Backend:
    name: BackendName
    xp: ArrayModule
    #: (ordinal, name) of every device the engine proves on
    devices: tuple[tuple[int, str], ...]
    #: ordinal -> NVML-style UUID ("GPU-..."), where the driver reports one
    uuids: Mapping[int, str] = field(default_factory=dict)

    def device(self, ordinal: int) -> AbstractContextManager[Any]:
        """Context making ``ordinal`` the current device (a no-op on NumPy)."""
        if self.name == BackendName.CUPY:
            ctx: AbstractContextManager[Any] = self.xp.cuda.Device(ordinal)
            return ctx
        return contextlib.nullcontext()

    @property
    def computes_on_host(self) -> bool:
        """True for NumPy: the device phase's working set and tables are host memory."""
        return self.name == BackendName.NUMPY

    @property
    def to_host(self) -> Callable[[Any], Any]:
        return self.xp.asnumpy if self.name == BackendName.CUPY else np.asarray

    def memory(self) -> list[GpuDevice]:
        """Per-device driver memory (``memGetInfo``) and allocator pool bytes; zeros on CPU."""
        out: list[GpuDevice] = []
        for ordinal, name in self.devices:
            if self.name == BackendName.CUPY:
                with self.xp.cuda.Device(ordinal):
                    free, total = self.xp.cuda.runtime.memGetInfo()
                    pool = int(self.xp.get_default_memory_pool().total_bytes())
                out.append(GpuDevice(gpu_ordinal=ordinal, name=name, used_bytes=total - free,
                                     total_bytes=total, pool_bytes=pool,
                                     uuid=self.uuids.get(ordinal, "")))
            else:
                out.append(GpuDevice(gpu_ordinal=ordinal, name=name, used_bytes=0,
                                     total_bytes=0, pool_bytes=0))
        return out


def _cupy_devices(cupy: Any) -> list[tuple[int, str]]:
    count = int(cupy.cuda.runtime.getDeviceCount())
    names = []
    for ordinal in range(count):
        raw = cupy.cuda.runtime.getDeviceProperties(ordinal)["name"]
        names.append((ordinal, raw.decode() if isinstance(raw, bytes) else str(raw)))
    return names


def format_gpu_uuid(raw: bytes | str) -> str:
    """CUDA's 16-byte device UUID as NVML and ``nvidia-smi -L`` print it, so the engine's
    ``cuzk_gpu_info`` joins the supervisor's ``cuzkd_gpu_info`` on ``uuid``."""
    if isinstance(raw, str):
        return raw if raw.startswith(("GPU-", "MIG-")) or not raw else f"GPU-{raw}"
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}" if len(raw) == 16 else ""


def _cupy_uuids(cupy: Any, ordinals: Sequence[int]) -> dict[int, str]:
    uuids: dict[int, str] = {}
    for ordinal in ordinals:
        raw = cupy.cuda.runtime.getDeviceProperties(ordinal).get("uuid")
        if isinstance(raw, bytes | str) and (uuid := format_gpu_uuid(raw)):
            uuids[ordinal] = uuid
    return uuids


def _try_cupy() -> tuple[Any, list[tuple[int, str]]] | None:
    try:
        cupy = importlib.import_module("cupy")
        devices = _cupy_devices(cupy)
    except Exception:  # ImportError, or CUDA errors when there is no driver/device
        return None
    return (cupy, devices) if devices else None


def select_backend(prefer: BackendName = BackendName.AUTO,
                   devices: Sequence[int] = ()) -> Backend:
    """Pick the backend; ``devices`` (GPU ordinals) restricts CuPy to those devices."""
    found = None if prefer == BackendName.NUMPY else _try_cupy()
    if found is None:
        if prefer == BackendName.CUPY:
            raise BackendError("backend 'cupy' requested but CuPy or a CUDA device is missing")
        return Backend(name=BackendName.NUMPY, xp=np, devices=((0, "cpu"),))
    cupy, available = found
    if devices:
        known = dict(available)
        missing = [d for d in devices if d not in known]
        if missing:
            raise BackendError(f"GPU ordinals {missing} not present (found {sorted(known)})")
        available = [(d, known[d]) for d in devices]
    return Backend(name=BackendName.CUPY, xp=cupy, devices=tuple(available),
                   uuids=_cupy_uuids(cupy, [ordinal for ordinal, _ in available]))
