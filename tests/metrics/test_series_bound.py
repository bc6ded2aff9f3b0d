"""The number of series does not grow with the number of jobs processed, and counters only grow.

Documents come from the real status tracker driven through whole job lifecycles.
"""

from __future__ import annotations

from cuzkd.metrics.sample import SupervisorSample
from cuzkd.status.tracker import StatusTracker

KINDS = ("porep-c2", "snap-update")
WORKERS = [(0, 0), (1, 0)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run_jobs(tracker: StatusTracker, clock: Clock, first: int, count: int) -> None:
    """Complete ``count`` jobs of 3 partitions, then leave one more job half-way."""
    for n in range(first, first + count + 1):
        job, kind = f"job-{n}", KINDS[n % len(KINDS)]
        tracker.register_job(job, kind, 3)
        for p in range(3):
            tracker.partition_synth_start(job, p)
            clock.now += 0.5
            tracker.partition_synth_end(job, p)
        if n == first + count:  # in flight: one partition on a GPU, one waiting for it
            tracker.partition_gpu_start(job, 0, 0)
            return
        for p in range(3):
            worker = p % 2
            tracker.partition_gpu_start(job, p, worker)
            clock.now += 0.2
            tracker.partition_gpu_end(job, p, worker)
        tracker.job_completed(job, kind, success=n % 50 != 7)


def sample_of(tracker: StatusTracker, make_engine) -> SupervisorSample:
    doc = tracker.snapshot()
    return SupervisorSample(engines=[make_engine("e0", status=doc)], zombies_reaped_total=0)


def test_series_count_is_independent_of_jobs_processed(make_engine, scrape):
    clock = Clock()
    tracker = StatusTracker(clock=clock)
    tracker.register_workers(WORKERS)
    run_jobs(tracker, clock, 0, 10)
    early = scrape(sample_of(tracker, make_engine))
    tracker.partition_gpu_end("job-10", 0, 0)  # let the half-way job go on
    tracker.job_completed("job-10", KINDS[0], success=True)
    run_jobs(tracker, clock, 11, 490)
    late = scrape(sample_of(tracker, make_engine))

    assert late.get_value("cuzk_jobs_completed_total", engine="e0", proof_kind="porep-c2") > 200
    assert not any("job" in dict(labels) for _, labels in late)
    assert len(early) == len(late)
    assert set(early) == set(late)
    counters = [key for key in early
                if key[0].endswith(("_total", "_bucket", "_count", "_sum"))]
    assert any(k[0] == "cuzk_gpu_worker_busy_seconds_total" for k in counters)
    decreased = [key for key in counters if late[key] < early[key]]
    assert decreased == []
