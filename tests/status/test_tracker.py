"""StatusTracker: the split-proving race, document fields, counters, retention, threads."""

from __future__ import annotations

import threading

import pytest

from cuzkd.status.document import (
    DURATION_BUCKETS,
    JOB_DURATION_BUCKETS,
    Allocation,
    GpuDevice,
    StatusDocument,
)
from cuzkd.status.tracker import StatusTracker

JOB_A = "ps-porep-1201-77-4411"


class Clock:
    """A monotonic clock the test advances by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, secs: float) -> None:
        self.now += secs


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tracker(clock: Clock) -> StatusTracker:
    t = StatusTracker(clock=clock, retain_finished_secs=30)
    t.register_workers([(0, 0), (1, 0)])
    return t


def synthesize(tracker: StatusTracker, job: str, *partitions: int) -> None:
    for p in partitions:
        tracker.partition_synth_start(job, p)
        tracker.partition_synth_end(job, p)


def worker(doc: StatusDocument, worker_id: int) -> tuple[str, str | None, int | None, float | None]:
    w = next(w for w in doc.gpu_workers if w.worker_id == worker_id)
    return w.state, w.current_job, w.current_partition, w.busy_secs


def busy_total(doc: StatusDocument, worker_id: int) -> float:
    assert doc.cuzkd_extensions is not None
    return next(w.busy_seconds_total for w in doc.cuzkd_extensions.worker_busy
                if w.worker_id == worker_id)


def test_late_finalizer_does_not_clear_worker_busy_with_next_partition(
    tracker: StatusTracker, clock: Clock
) -> None:
    tracker.register_job(JOB_A, "porep-c2", 2)
    synthesize(tracker, JOB_A, 0, 1)
    tracker.partition_gpu_start(JOB_A, 0, 0)  # W0 starts A
    clock.advance(2.0)
    tracker.partition_gpu_start(JOB_A, 1, 0)  # W0 starts B; A's finalizer still running
    clock.advance(0.5)
    tracker.partition_gpu_end(JOB_A, 0, 0)  # finalizer ends A
    clock.advance(0.25)
    doc = tracker.snapshot()
    assert worker(doc, 0) == ("proving", JOB_A, 1, pytest.approx(0.75))  # B's start time
    parts = doc.pipelines[0].partitions
    assert (parts[0].state, parts[0].gpu_ms) == ("done", 2500)  # A's duration still recorded
    assert (parts[1].state, parts[1].gpu_ms) == ("gpu", 750)
    assert busy_total(doc, 0) == pytest.approx(2.75)  # A's span ended at B's start: no overlap

    clock.advance(1.0)
    tracker.partition_gpu_end(JOB_A, 1, 0)  # finalizer ends B
    clock.advance(5.0)
    doc = tracker.snapshot()
    assert worker(doc, 0) == ("idle", None, None, None)
    assert busy_total(doc, 0) == pytest.approx(3.75)  # nothing counted while idle
    assert doc.pipelines[0].partitions_done == 2


def test_partition_durations_follow_cuzk_semantics(tracker: StatusTracker, clock: Clock) -> None:
    tracker.register_job(JOB_A, "porep-c2", 2)
    clock.advance(1.0)
    part = tracker.snapshot().pipelines[0].partitions[0]
    assert (part.state, part.synth_ms, part.gpu_ms) == ("pending", None, None)

    tracker.partition_synth_start(JOB_A, 0)
    clock.advance(0.3)
    doc = tracker.snapshot()
    assert (doc.pipelines[0].partitions[0].synth_ms, doc.synthesis.active) == (300, 1)

    tracker.partition_synth_end(JOB_A, 0)
    clock.advance(4.0)  # finished durations stop growing
    part = tracker.snapshot().pipelines[0].partitions[0]
    assert (part.state, part.synth_ms, part.gpu_ms) == ("synth_done", 300, None)

    tracker.partition_gpu_start(JOB_A, 0, 1)
    clock.advance(0.2)
    part = tracker.snapshot().pipelines[0].partitions[0]
    assert (part.state, part.gpu_ms) == ("gpu", 200)
    tracker.partition_gpu_end(JOB_A, 0, 1)
    clock.advance(1.0)
    doc = tracker.snapshot()
    pipeline = doc.pipelines[0]
    assert (pipeline.partitions[0].state, pipeline.partitions[0].gpu_ms) == ("done", 200)
    assert (pipeline.partitions_done, pipeline.total_partitions) == (1, 2)
    assert pipeline.started_secs_ago == pytest.approx(6.5)
    assert doc.uptime_secs == pytest.approx(6.5)
    assert doc.synthesis.active == 0


def test_failure_freezes_running_phase_and_releases_its_worker(
    tracker: StatusTracker, clock: Clock
) -> None:
    tracker.register_job(JOB_A, "porep-c2", 3)
    synthesize(tracker, JOB_A, 0)
    tracker.partition_gpu_start(JOB_A, 0, 0)
    tracker.partition_synth_start(JOB_A, 1)
    clock.advance(1.0)
    tracker.partition_failed(JOB_A, 0)
    tracker.partition_failed(JOB_A, 1)
    tracker.partition_failed(JOB_A, 2)  # from pending
    clock.advance(3.0)
    doc = tracker.snapshot()
    assert [(p.state, p.synth_ms, p.gpu_ms) for p in doc.pipelines[0].partitions] == [
        ("failed", 0, 1000), ("failed", 1000, None), ("failed", None, None)]
    assert worker(doc, 0) == ("idle", None, None, None)
    assert busy_total(doc, 0) == pytest.approx(1.0)
    assert doc.synthesis.active == 0
    tracker.partition_gpu_end(JOB_A, 0, 0)  # a late finalizer cannot resurrect it
    assert tracker.snapshot().pipelines[0].partitions[0].state == "failed"


def test_cumulative_counters_and_histograms(tracker: StatusTracker, clock: Clock) -> None:
    tracker.register_job(JOB_A, "porep-c2", 2)
    tracker.register_job("w-1", "winning-post", 1)
    for p in (0, 1):
        tracker.partition_synth_start(JOB_A, p)
        clock.advance(0.02)
        tracker.partition_synth_end(JOB_A, p)
    tracker.partition_gpu_start(JOB_A, 0, 0)
    clock.advance(3.0)
    tracker.partition_gpu_end(JOB_A, 0, 0)
    tracker.partition_failed(JOB_A, 1)
    tracker.job_completed(JOB_A, "porep-c2", success=False)
    ext = tracker.snapshot().cuzkd_extensions
    assert ext is not None
    assert ext.phase_transitions == {
        "porep-c2": {"synthesizing": 2, "synth_done": 2, "gpu": 1, "done": 1, "failed": 1},
        "winning-post": {"synthesizing": 0, "synth_done": 0, "gpu": 0, "done": 0, "failed": 0},
    }
    synth = ext.synth_duration_seconds["porep-c2"]
    assert (synth.count, synth.sum) == (2, pytest.approx(0.04))
    assert synth.bounds == list(DURATION_BUCKETS)
    le = dict(zip(synth.bounds, synth.bucket_counts, strict=True))
    assert (le[0.01], le[0.025], le[600.0]) == (0, 2, 2)
    gpu = ext.gpu_duration_seconds["porep-c2"]
    assert (gpu.count, gpu.sum) == (1, pytest.approx(3.0))
    le = dict(zip(gpu.bounds, gpu.bucket_counts, strict=True))
    assert (le[2.5], le[5.0]) == (0, 1)
    assert ext.gpu_duration_seconds["winning-post"].count == 0
    assert ext.jobs_in_flight == 1  # w-1


def test_finished_jobs_leave_pipelines_after_retention_but_counters_stay(
    tracker: StatusTracker, clock: Clock
) -> None:
    tracker.register_job(JOB_A, "porep-c2", 1)
    synthesize(tracker, JOB_A, 0)
    tracker.partition_gpu_start(JOB_A, 0, 0)
    tracker.partition_gpu_end(JOB_A, 0, 0)
    tracker.job_completed(JOB_A, "porep-c2", success=True)
    # never registered: still counted
    tracker.job_completed("plain-job", "window-post", success=True)
    tracker.job_completed("bad-job", "window-post", success=False)
    clock.advance(29.0)
    doc = tracker.snapshot()
    assert [p.job_id for p in doc.pipelines] == [JOB_A]
    clock.advance(2.0)
    doc = tracker.snapshot()
    assert doc.pipelines == []
    assert (doc.counters.total_completed, doc.counters.total_failed) == (2, 1)
    assert doc.counters.completed_by_kind == {"porep-c2": 1, "window-post": 1}
    assert doc.counters.failed_by_kind == {"window-post": 1}
    assert doc.cuzkd_extensions is not None
    assert doc.cuzkd_extensions.phase_transitions["porep-c2"]["done"] == 1
    assert doc.cuzkd_extensions.jobs_in_flight == 0
    tracker.partition_gpu_end(JOB_A, 0, 0)  # collected job: ignored, no error


def test_unknown_ids_and_out_of_order_calls_are_ignored(
    tracker: StatusTracker, clock: Clock
) -> None:
    tracker.register_job(JOB_A, "porep-c2", 1)
    before = tracker.snapshot()
    tracker.partition_synth_start("nope", 0)
    tracker.partition_synth_start(JOB_A, 5)
    tracker.partition_synth_start(JOB_A, -1)
    tracker.partition_synth_end(JOB_A, 0)  # not synthesizing
    tracker.partition_gpu_start(JOB_A, 0, 0)  # not synthesized
    synthesize(tracker, JOB_A, 0)
    tracker.partition_gpu_start(JOB_A, 0, 99)  # unknown worker: nothing changes
    tracker.partition_gpu_end(JOB_A, 0, 99)
    tracker.partition_failed("nope", 0)
    tracker.register_job(JOB_A, "snap-update", 7)  # duplicate id keeps the first registration
    doc = tracker.snapshot()
    assert doc.gpu_workers == before.gpu_workers
    assert [(p.job_id, p.proof_kind, p.total_partitions) for p in doc.pipelines] == [
        (JOB_A, "porep-c2", 1)]
    assert doc.pipelines[0].partitions[0].state == "synth_done"
    assert doc.cuzkd_extensions is not None
    assert doc.cuzkd_extensions.phase_transitions["porep-c2"]["synthesizing"] == 1


def test_gauges_budget_allocations_devices_and_backend(clock: Clock) -> None:
    class Budget:
        used = 600

        def total_bytes(self) -> int:
            return 1000

        def used_bytes(self) -> int:
            return self.used

        def max_concurrent_synthesis(self) -> int:
            return 4

    budget = Budget()
    tracker = StatusTracker(budget=budget, clock=clock)
    doc = tracker.snapshot()
    assert (doc.memory.total_bytes, doc.memory.used_bytes, doc.memory.available_bytes) == (
        1000, 600, 400)
    assert doc.synthesis.max_concurrent == 4
    budget.used = 1200
    assert tracker.snapshot().memory.available_bytes == 0

    srs = Allocation(circuit_id="porep-32g", bytes=5, last_used_secs_ago=1.0, evictable=False)
    device = GpuDevice(gpu_ordinal=0, name="cpu", used_bytes=0, total_bytes=0, pool_bytes=0)
    tracker.set_allocations(srs=[srs], pce=())
    tracker.set_gpu_devices([device])
    tracker.set_backend("numpy")
    tracker.set_queue_depth(3)
    tracker.set_buffers(provers_in_flight=2)
    tracker.set_buffers(aux_in_flight=1)
    doc = tracker.snapshot()
    assert (doc.allocations.srs, doc.allocations.pce) == ([srs], [])
    assert doc.counters.queue_depth == 3
    assert (doc.buffers.provers_in_flight, doc.buffers.aux_in_flight) == (2, 1)
    assert doc.cuzkd_extensions is not None
    assert (doc.cuzkd_extensions.gpu_devices, doc.cuzkd_extensions.backend) == (
        [device], "numpy")
    with pytest.raises(TypeError, match="synth_inflight"):
        tracker.set_buffers(synth_inflight=1)
    with pytest.raises(ValueError, match="queue depth"):
        tracker.set_queue_depth(-1)
    assert StatusTracker(clock=clock).snapshot().synthesis.max_concurrent == 0


def test_concurrent_threads_keep_counts_exact() -> None:
    """Real threads drive disjoint jobs through the lifecycle while another snapshots."""
    tracker = StatusTracker()
    workers, jobs_per_thread, partitions = 4, 25, 4
    tracker.register_workers((w, 0) for w in range(workers))
    stop = threading.Event()
    errors: list[BaseException] = []

    def drive(worker_id: int) -> None:
        try:
            for j in range(jobs_per_thread):
                job = f"job-{worker_id}-{j}"
                tracker.register_job(job, "porep-c2", partitions)
                for p in range(partitions):
                    tracker.partition_synth_start(job, p)
                    tracker.partition_synth_end(job, p)
                    tracker.partition_gpu_start(job, p, worker_id)
                    tracker.partition_gpu_end(job, p, worker_id)
                tracker.job_completed(job, "porep-c2", success=True)
        except BaseException as exc:  # surfaced by the main thread's assert
            errors.append(exc)

    def observe() -> None:
        while not stop.is_set():
            tracker.snapshot()

    observer = threading.Thread(target=observe)
    observer.start()
    threads = [threading.Thread(target=drive, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    observer.join()
    assert errors == []
    doc = tracker.snapshot()
    total = workers * jobs_per_thread * partitions
    assert doc.counters.total_completed == workers * jobs_per_thread
    assert doc.cuzkd_extensions is not None
    assert doc.cuzkd_extensions.phase_transitions["porep-c2"] == dict.fromkeys(
        ("synthesizing", "synth_done", "gpu", "done"), total) | {"failed": 0}
    assert all(w.state == "idle" for w in doc.gpu_workers)


def test_job_durations_from_registration_to_completion(tracker: StatusTracker,
                                                      clock: Clock) -> None:
    tracker.register_job("w1", "winning-post", 1)
    clock.advance(7)
    tracker.job_completed("w1", "winning-post", True)
    tracker.register_job("w2", "winning-post", 1)
    clock.advance(25)
    tracker.job_completed("w2", "winning-post", False)  # failed jobs are timed too
    tracker.job_completed("w2", "winning-post", False)  # a second completion is not
    tracker.job_completed("never-registered", "winning-post", True)
    ext = tracker.snapshot().cuzkd_extensions
    assert ext is not None
    h = ext.job_duration_seconds["winning-post"]
    assert h.bounds == list(JOB_DURATION_BUCKETS)
    assert (h.count, h.sum) == (2, 32.0)
    by_bound = dict(zip(h.bounds, h.bucket_counts, strict=True))
    assert (by_bound[5.0], by_bound[10.0], by_bound[20.0], by_bound[30.0]) == (0, 1, 1, 2)
