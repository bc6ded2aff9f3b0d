"""The reference engine on a GPU: busy fraction with 2 workers per GPU, and its GPU memory.

A real ``cuzkd engine`` (backend cupy, device 0, 2 workers) gets a burst of jobs; the test
samples /status until they are done. The busy fraction counts only intervals where synthesized
partitions were waiting (≥ workers deep): that is when the GPU pipeline alone decides how busy
the device is. The memory figures are the status document's ``gpu_devices``, which the
supervisor exports unchanged as cuzk_gpu_memory_{used,total,pool}_bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.gpu_measure import waiting_busy_fraction

from cuzkd.bundled.backend import Backend
from cuzkd.status.document import StatusDocument, decode_status

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]
WORKERS = 2
SIZE_LOG2 = int(os.environ.get("CUZKD_GPU_CHECK_SIZE_LOG2", "16"))
JOBS = int(os.environ.get("CUZKD_GPU_CHECK_JOBS", "96"))
LOAD_SECS = 90.0
MIN_BUSY = 0.95


@contextlib.contextmanager
def _engine(tmp: Path) -> Iterator[str]:
    config = tmp / "engine.toml"
    config.write_text(f'backend = "cupy"\ndevices = [0]\nworkers_per_gpu = {WORKERS}\n'
                      f'synthesis_threads = 0\n[sizes]\nsnap = {SIZE_LOG2}\n')
    log = tmp / "engine.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "cuzkd", "engine", "--config",
                                 str(config), "--listen", "127.0.0.1:0"], stderr=sink)
    try:
        deadline = time.monotonic() + 60
        address = ""
        while not address:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"engine did not start:\n{log.read_text()}"
            for line in log.read_text().splitlines():
                event = json.loads(line) if line.startswith("{") else {}
                if event.get("event") == "engine_listening":
                    address = str(event["address"])
            time.sleep(0.05)
        yield f"http://{address}"
    finally:
        proc.terminate()
        proc.wait(60)


def _status(base: str) -> StatusDocument:
    with urllib.request.urlopen(f"{base}/status", timeout=10) as resp:
        return decode_status(resp.read())


def _submit(base: str) -> None:
    request = urllib.request.Request(f"{base}/v1/jobs", data=b'{"proof_kind": "snap-update"}',
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status in (200, 201, 202)


def test_two_workers_keep_the_gpu_busy_and_memory_is_reported(
        cupy_backend: Backend, tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    cp = cupy_backend.xp
    device_bytes = int(cp.cuda.runtime.getDeviceProperties(0)["totalGlobalMem"])
    with _engine(tmp_path) as base:
        for _ in range(JOBS):
            _submit(base)
        samples: list[tuple[float, StatusDocument]] = []
        deadline = time.monotonic() + LOAD_SECS
        while time.monotonic() < deadline:
            doc = _status(base)
            samples.append((time.monotonic(), doc))
            if doc.counters.total_completed + doc.counters.total_failed >= JOBS:
                break
            time.sleep(0.05)  # the sampling period, not a synchronisation
    last = samples[-1][1]
    assert last.counters.total_failed == 0
    ext = last.cuzkd_extensions
    assert ext is not None and ext.backend == "cupy"
    (gpu,) = [d for d in ext.gpu_devices if d.gpu_ordinal == 0]
    record_property("gpu_name", gpu.name)
    record_property("gpu_memory_used_bytes", gpu.used_bytes)
    record_property("gpu_memory_total_bytes", gpu.total_bytes)
    record_property("gpu_memory_pool_bytes", gpu.pool_bytes)
    assert gpu.total_bytes == device_bytes
    assert 0 < gpu.used_bytes <= gpu.total_bytes
    assert 0 < gpu.pool_bytes <= gpu.total_bytes

    waiting = waiting_busy_fraction(samples, WORKERS)
    record_property("jobs_completed", last.counters.total_completed)
    record_property("busy_measured_secs", round(waiting.measured_secs, 2))
    record_property("busy_fraction_while_waiting",
                    None if waiting.fraction is None else round(waiting.fraction, 4))
    print(f"busy fraction while work waited: {waiting.fraction} over "
          f"{waiting.measured_secs:.1f} s; {gpu.name}: used {gpu.used_bytes} of "
          f"{gpu.total_bytes} bytes, pool {gpu.pool_bytes}")
    assert waiting.measured_secs >= 1.0, (
        f"GPU work waited {WORKERS} deep for only {waiting.measured_secs:.2f} s: synthesis "
        f"starves the GPU at size 2^{SIZE_LOG2}; raise CUZKD_GPU_CHECK_SIZE_LOG2")
    assert waiting.fraction is not None and waiting.fraction >= MIN_BUSY
