"""Micro-benchmark of StatusTracker: lifecycle calls per second and snapshot cost.

Run by hand: ``.venv/bin/python bench/status_tracker.py``. Shape: 64 jobs x 16 partitions,
8 GPU workers (the issue's reference load). Figures go to docs/benchmarks.md (section status).
"""

from __future__ import annotations

import argparse
import statistics
import time

from cuzkd.log.configure import configure_logging
from cuzkd.status.document import encode_status
from cuzkd.status.tracker import StatusTracker


def drive_lifecycle(tracker: StatusTracker, jobs: int, partitions: int, workers: int) -> int:
    """Take every partition of every job through its whole lifecycle; returns calls made."""
    calls = 0
    for j in range(jobs):
        job = f"ps-porep-{j}"
        tracker.register_job(job, "porep-c2", partitions)
        calls += 1
        for p in range(partitions):
            worker = (j * partitions + p) % workers
            tracker.partition_synth_start(job, p)
            tracker.partition_synth_end(job, p)
            tracker.partition_gpu_start(job, p, worker)
            tracker.partition_gpu_end(job, p, worker)
            calls += 4
        tracker.job_completed(job, "porep-c2", success=True)
        calls += 1
    return calls


def half_way(jobs: int, partitions: int, workers: int) -> StatusTracker:
    """A tracker with every job in flight and partitions spread over all phases."""
    tracker = StatusTracker()
    tracker.register_workers((w, w % 2) for w in range(workers))
    for j in range(jobs):
        job = f"ps-porep-{j}"
        tracker.register_job(job, "porep-c2", partitions)
        for p in range(partitions):
            stage = p % 4
            if stage >= 1:
                tracker.partition_synth_start(job, p)
            if stage >= 2:
                tracker.partition_synth_end(job, p)
            if stage >= 3:
                tracker.partition_gpu_start(job, p, (j + p) % workers)
    return tracker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    configure_logging(level="info")

    rates = []
    for _ in range(args.rounds):
        tracker = StatusTracker()
        tracker.register_workers((w, w % 2) for w in range(args.workers))
        start = time.perf_counter()
        calls = drive_lifecycle(tracker, args.jobs, args.partitions, args.workers)
        rates.append(calls / (time.perf_counter() - start))

    tracker = half_way(args.jobs, args.partitions, args.workers)
    snap_ms, encode_ms = [], []
    for _ in range(args.rounds * 10):
        start = time.perf_counter()
        doc = tracker.snapshot()
        mid = time.perf_counter()
        body = encode_status(doc)
        snap_ms.append((mid - start) * 1000)
        encode_ms.append((time.perf_counter() - mid) * 1000)

    print(f"shape: {args.jobs} jobs x {args.partitions} partitions, {args.workers} workers")
    print(f"lifecycle calls/s: median {statistics.median(rates):,.0f}  "
          f"(min {min(rates):,.0f}, max {max(rates):,.0f})")
    print(f"snapshot(): median {statistics.median(snap_ms):.2f} ms  "
          f"p95 {statistics.quantiles(snap_ms, n=20)[-1]:.2f} ms")
    print(f"encode_status(): median {statistics.median(encode_ms):.2f} ms  "
          f"({len(body):,} bytes)")


if __name__ == "__main__":
    main()
