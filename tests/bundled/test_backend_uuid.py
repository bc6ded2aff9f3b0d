"""The engine's device UUID is printed as NVML prints it (so the two gpu_info series join)."""

from __future__ import annotations

from cuzkd.bundled.backend import format_gpu_uuid


def test_cuda_uuid_bytes_become_nvml_text() -> None:
    raw = bytes.fromhex("5f1c7a2e0b3d4c8e9a612d4f8e6b1c03")
    assert format_gpu_uuid(raw) == "GPU-5f1c7a2e-0b3d-4c8e-9a61-2d4f8e6b1c03"
    assert format_gpu_uuid(b"short") == ""
    assert format_gpu_uuid("GPU-already") == "GPU-already"
    assert format_gpu_uuid("") == ""
