"""GPU tests: CuPy on a real CUDA device. Run by ``scripts/gpu-check.sh`` on a GPU machine.

Without CuPy or without a device every test here is skipped with the reason; the helpers they
use (gpu_measure.py) are pure and tested on the CPU in test_gpu_measure.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent.parent
for _dir in (_TESTS / "gpu", _TESTS / "supervisor"):  # gpu_measure; sv_fake_engine's document
    if str(_dir) not in sys.path:
        sys.path.insert(0, str(_dir))

from cuzkd.engine.backend import Backend, BackendError, select_backend  # noqa: E402


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
