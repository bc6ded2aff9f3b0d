"""NVML on a real GPU: the supervisor's view (cuzkd.gpus) reads the devices, and the engine's
device UUID (from CuPy) is the one NVML reports, so cuzk_gpu_info joins cuzkd_gpu_info."""

from __future__ import annotations

import pytest

from cuzkd.bundled.backend import Backend
from cuzkd.gpus import load_gpu_view
from cuzkd.supervisor.core.gpugate import blocker

pytestmark = pytest.mark.gpu


def test_nvml_reads_devices_and_matches_the_engines_uuid(cupy_backend: Backend) -> None:
    view, reason = load_gpu_view()
    if view is None:
        pytest.skip(reason)
    devices = view.devices()
    assert devices, "NVML sees no device although CuPy does"
    for device in devices:
        assert device.uuid.startswith(("GPU-", "MIG-")), device
        assert 0 <= device.memory_used_bytes <= device.memory_total_bytes
        assert device.utilization_ratio is None or 0 <= device.utilization_ratio <= 1
    [engine_device] = cupy_backend.memory()
    assert engine_device.uuid in {d.uuid for d in devices}
    # nothing of a dead process holds GPU 0 and its free memory covers a small engine
    assert blocker(devices, [engine_device.uuid], {2**22 + 1}, 2**20) is None
