"""What the GPU checks measure, kept apart from the devices they measure.

- Busy fraction *while GPU work is waiting*: over consecutive /status samples that both show at
  least ``workers`` synthesized partitions queued for the GPU, Σ Δ worker busy seconds /
  (Δ wall × workers). Intervals where the GPU starves for synthesis say nothing about the GPU
  pipeline, so they are left out rather than averaged in.
- NTT throughput as a fraction of the device's copy bandwidth: a radix-2 NTT of n 8-byte
  elements reads and writes the whole vector once per stage, so it moves at least
  2 · 8 · n · log2(n) bytes; divided by its time, and by the bandwidth of a device-to-device
  copy (which moves 2 · nbytes), it says how close the transform runs to the memory bound.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cuzkd.status.document import StatusDocument

ELEMENT_BYTES = 8  # BabyBear elements are held in uint64


def synth_done(doc: StatusDocument) -> int:
    """Partitions synthesized and waiting for a GPU worker."""
    return sum(1 for p in doc.pipelines for part in p.partitions if part.state == "synth_done")


def busy_total(doc: StatusDocument) -> float:
    ext = doc.cuzkd_extensions
    if ext is None:
        raise ValueError("the engine serves no cuzkd_extensions (worker busy totals)")
    return sum(w.busy_seconds_total for w in ext.worker_busy)


@dataclass(frozen=True)
class WaitingBusy:
    fraction: float | None  # None when GPU work never waited
    measured_secs: float


def waiting_busy_fraction(samples: Sequence[tuple[float, StatusDocument]],
                          workers: int) -> WaitingBusy:
    """Busy fraction over the intervals where both ends had ≥ ``workers`` partitions waiting."""
    busy = wall = 0.0
    for (t0, d0), (t1, d1) in itertools.pairwise(samples):
        if synth_done(d0) >= workers and synth_done(d1) >= workers and t1 > t0:
            busy += busy_total(d1) - busy_total(d0)
            wall += t1 - t0
    return WaitingBusy(busy / (wall * workers) if wall > 0 else None, wall)


def ntt_bytes_moved(log_n: int) -> int:
    """Lower bound on the bytes a radix-2 NTT of size 2^log_n reads and writes."""
    return 2 * ELEMENT_BYTES * (1 << log_n) * log_n


def best_time(fn: Callable[[], Any], sync: Callable[[], None], repeat: int = 5) -> float:
    """Fastest of ``repeat`` runs after a warm-up (tables built, kernels compiled)."""
    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best
