"""GPU tests: CuPy on a real CUDA device. Run by ``scripts/gpu-check.sh`` on a GPU machine.

Without CuPy or without a device every test here is skipped with the reason; the helpers they
use (tests/support/gpu_measure.py) are pure and tested on the CPU in test_measure.py.
"""

from __future__ import annotations

import pytest

from cuzkd.bundled.backend import Backend, select_backend
from cuzkd.errors import BackendError


@pytest.fixture(scope="session")
def cupy_backend() -> Backend:
    """The CuPy backend on device 0, or a skip saying why there is none."""
    try:
        return select_backend("cupy", devices=(0,))
    except BackendError as exc:
        try:
            import cupy  # noqa: F401
        except ImportError:
            pytest.skip("CuPy is not installed (pip install '.[gpu]')")
        pytest.skip(f"no CUDA device: {exc}")
