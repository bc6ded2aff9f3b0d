"""CuPy NTTs equal NumPy's bit for bit, n = 2^10 … 2^22, and how close they run to memory speed."""

from __future__ import annotations

import numpy as np
import pytest
from support.gpu_measure import best_time, ntt_bytes_moved

from cuzkd.bundled import field
from cuzkd.bundled.backend import Backend
from cuzkd.bundled.ntt import NttPlan

pytestmark = pytest.mark.gpu
TRANSFORMS = ("forward", "inverse", "coset_forward", "coset_inverse")


@pytest.mark.parametrize("log_n", range(10, 23))
def test_cupy_transforms_equal_numpy_exactly(cupy_backend: Backend, log_n: int) -> None:
    cp = cupy_backend.xp
    rng = np.random.default_rng(log_n)
    host = rng.integers(0, field.P, size=(3, 1 << log_n), dtype=np.uint64)
    cpu, gpu = NttPlan(log_n, np), NttPlan(log_n, cp)
    with cupy_backend.device(0):
        device = cp.asarray(host)
        for name in TRANSFORMS:
            expected = getattr(cpu, name)(host)
            got = cp.asnumpy(getattr(gpu, name)(device))
            assert got.dtype == expected.dtype and np.array_equal(got, expected), name


def test_ntt_throughput_against_device_copy_bandwidth(
        cupy_backend: Backend, record_property: pytest.RecordProperty) -> None:
    """Recorded for docs/benchmarks.md; asserted only to be a real, physical measurement."""
    cp = cupy_backend.xp
    log_n = 22
    sync = cp.cuda.Stream.null.synchronize
    with cupy_backend.device(0):
        vec = cp.asarray(np.random.default_rng(0).integers(
            0, field.P, size=1 << log_n, dtype=np.uint64))
        big = cp.empty(1 << 28, dtype=cp.uint8)  # 256 MiB: well past every cache
        copy_secs = best_time(lambda: big.copy(), sync)
        plan = NttPlan(log_n, cp)
        ntt_secs = best_time(lambda: plan.forward(vec), sync)
    copy_bw = 2 * big.nbytes / copy_secs
    ntt_bw = ntt_bytes_moved(log_n) / ntt_secs
    fraction = ntt_bw / copy_bw
    record_property("d2d_copy_bandwidth_gbs", round(copy_bw / 1e9, 1))
    record_property("ntt_2^22_ms", round(ntt_secs * 1e3, 3))
    record_property("ntt_2^22_elements_per_s", round((1 << log_n) / ntt_secs))
    record_property("ntt_fraction_of_copy_bandwidth", round(fraction, 4))
    print(f"d2d copy {copy_bw / 1e9:.1f} GB/s; NTT 2^{log_n} {ntt_secs * 1e3:.2f} ms "
          f"= {ntt_bw / 1e9:.1f} GB/s = {fraction:.3f} of copy bandwidth")
    assert 0 < fraction < 1.5, "an NTT cannot beat the memory bound by much"
