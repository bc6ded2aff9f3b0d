"""Cost of the stall watchdog per sampled document: ``python bench/stall.py [--jobs N]``.

Builds a busy engine's status document -- N jobs of 10 partitions in mixed phases, 16 GPU
workers (the default ``--jobs 1400``: 14,000 partitions, ~1 MB of JSON) -- and times
``StallWatch.observe`` on it, alternating two documents that differ in one partition (so every
call finds progress and walks everything, the worst case). Prints the median in milliseconds;
the runner feeds the watch at most ``STALL_SAMPLES`` documents per ``stall_after``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from cuzkd.status.document import (
    Allocations,
    Buffers,
    Counters,
    GpuWorker,
    Memory,
    Partition,
    PartitionState,
    Pipeline,
    StatusDocument,
    Synthesis,
    encode_status,
)
from cuzkd.supervisor.core.cadence import STALL_SAMPLES
from cuzkd.supervisor.core.stall import StallWatch


def document(jobs: int, moved: bool) -> StatusDocument:
    pipelines = []
    for j in range(jobs):
        parts = [Partition(index=i, state=tuple(PartitionState)[(i + j) % 4], synth_ms=1000 + i,
                           gpu_ms=None) for i in range(10)]
        if moved and j == 0:
            parts[0] = Partition(index=0, state="done", synth_ms=1000, gpu_ms=500)
        pipelines.append(Pipeline(job_id=f"ps-porep-{j:06d}-77-4411-abcdef", proof_kind="porep-c2",
                                  started_secs_ago=12.5, total_partitions=10,
                                  partitions_done=0, partitions=parts))
    workers = [GpuWorker(worker_id=w, gpu_ordinal=w // 4, state="proving",
                         current_job=f"ps-porep-{w:06d}-77-4411-abcdef", current_partition=3,
                         busy_secs=1.5) for w in range(16)]
    return StatusDocument(
        uptime_secs=100.0, memory=Memory(total_bytes=1, used_bytes=0, available_bytes=1),
        synthesis=Synthesis(max_concurrent=8, active=4), pipelines=pipelines,
        gpu_workers=workers, allocations=Allocations(srs=[], pce=[]),
        counters=Counters(total_completed=0, total_failed=0, completed_by_kind={},
                          failed_by_kind={}, queue_depth=3),
        buffers=Buffers(synth_in_flight=0, provers_in_flight=0, aux_in_flight=0,
                        shells_in_flight=0, pending_handles=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=1400)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    docs = [document(args.jobs, moved) for moved in (False, True)]
    watch = StallWatch(600.0)
    watch.started(0.0)
    times = []
    for i in range(args.repeat):
        start = time.perf_counter()
        watch.observe(float(i), docs[i % 2], None)
        times.append(time.perf_counter() - start)
    size = len(encode_status(docs[0]))
    median = statistics.median(times) * 1000
    print(f"{args.jobs} jobs, {args.jobs * 10} partitions, {size / 2**20:.2f} MiB document: "
          f"observe median {median:.2f} ms; at {STALL_SAMPLES} samples per stall_after "
          f"(10 min) that is {median * STALL_SAMPLES / 600:.3f} ms of CPU per second")


if __name__ == "__main__":
    main()
