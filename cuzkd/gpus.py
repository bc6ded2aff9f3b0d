"""The supervisor's own view of the host's GPUs, through NVML.

The supervisor must see GPU memory without CuPy and without a CUDA context of its own (a
context would itself hold device memory): NVML, the library ``nvidia-smi`` uses, reads per-device
memory, utilization and the processes holding memory. ``nvidia-ml-py`` (imported as ``pynvml``)
comes with the ``nvml`` extra, which ``gpu`` includes.

:class:`GpuView` is the seam: the memory gate's wait (:mod:`cuzkd.supervisor.engines.gpuwait`)
and the exporter read devices through it, :class:`NvmlView` is the real one, tests inject their own.
:func:`load_gpu_view` returns None (with the reason) when NVML is not installed or has no
driver, and everything GPU-related then becomes a no-op.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cuzkd.errors import GpuViewError


@dataclass(frozen=True)
class NvmlDevice:
    """One GPU as NVML reports it; ``index`` is NVML's (PCI bus order)."""

    index: int
    uuid: str
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    #: share of the last sample period a kernel ran (0..1); None when NVML cannot tell
    utilization_ratio: float | None
    #: processes holding device memory (compute contexts), pid -> bytes (None: unknown)
    processes: dict[int, int | None]

    def matches(self, wanted: str) -> bool:
        """``wanted`` is this device's NVML index (``"0"``) or its UUID (``"GPU-..."``)."""
        return wanted == str(self.index) or wanted == self.uuid


class GpuView(Protocol):
    """Reads the host's GPUs; raises :class:`GpuViewError` when the driver does not answer."""

    def devices(self) -> Sequence[NvmlDevice]: ...


class NvmlView:
    """:class:`GpuView` over pynvml. NVML calls take the driver's lock and may block for
    milliseconds: callers on the event loop run :meth:`devices` in a thread."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()

    def devices(self) -> list[NvmlDevice]:
        nvml = self._nvml
        with self._lock:
            try:
                return [self._device(i) for i in range(nvml.nvmlDeviceGetCount())]
            except nvml.NVMLError as exc:
                raise GpuViewError(f"NVML: {exc}") from exc

    def _device(self, index: int) -> NvmlDevice:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            utilization: float | None = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
        except nvml.NVMLError:  # not supported on every board (or under MIG)
            utilization = None
        processes = {p.pid: _memory_of(p)
                     for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        return NvmlDevice(index=index, uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                          name=_text(nvml.nvmlDeviceGetName(handle)),
                          memory_used_bytes=int(memory.used),
                          memory_total_bytes=int(memory.total),
                          utilization_ratio=utilization, processes=processes)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _memory_of(process: Any) -> int | None:
    used = getattr(process, "usedGpuMemory", None)
    return int(used) if isinstance(used, int) else None  # None: NVML_VALUE_NOT_AVAILABLE


def load_gpu_view() -> tuple[GpuView | None, str]:
    """(the NVML view, "") or (None, why not): the package missing, or no driver/device."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install 'cuzkd[nvml]')"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML unavailable: {exc}"
    return NvmlView(pynvml), ""
