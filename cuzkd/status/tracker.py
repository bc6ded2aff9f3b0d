"""The engine's live status model: lifecycle events in, cuzk's ``/status`` document out.

The reference engine reports every partition transition and every GPU worker span to a
:class:`StatusTracker`, from worker threads and from its event loop; :meth:`StatusTracker.snapshot`
turns the state into a :class:`~cuzkd.status.document.StatusDocument` with cuzk's exact fields
plus the cumulative ``cuzkd_extensions`` block a real cuzk cannot serve. It never raises into the
engine for an id it no longer or never knew, and keeps split GPU proving's busy time exact. The
rules are docs/status.md, *Partition and worker rules*.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import structlog

from cuzkd.status.counters import KindCounters
from cuzkd.status.document import (
    TERMINAL_STATES,
    Allocation,
    Allocations,
    Buffers,
    Counters,
    Extensions,
    GpuDevice,
    GpuWorker,
    Memory,
    Partition,
    PartitionState,
    Pipeline,
    StatusDocument,
    Synthesis,
    WorkerBusyTotal,
    WorkerState,
)

_log = structlog.get_logger("cuzkd.status")


#: target phase -> the phase a partition must be in to enter it (``failed``: any non-terminal).
_REQUIRED_PREVIOUS: dict[PartitionState, PartitionState] = {
    PartitionState.SYNTHESIZING: PartitionState.PENDING,
    PartitionState.SYNTH_DONE: PartitionState.SYNTHESIZING,
    PartitionState.GPU: PartitionState.SYNTH_DONE,
    PartitionState.DONE: PartitionState.GPU,
}

_BUFFER_FIELDS: tuple[str, ...] = tuple(Buffers.__struct_fields__)


class MemoryBudgetView(Protocol):
    """What the tracker reads from the engine's host-memory budget at each snapshot."""

    def total_bytes(self) -> int: ...
    def used_bytes(self) -> int: ...
    def max_concurrent_synthesis(self) -> int: ...


class _PartitionRecord:
    __slots__ = ("gpu_end", "gpu_start", "state", "synth_end", "synth_start")

    def __init__(self) -> None:
        self.state = PartitionState.PENDING
        self.synth_start: float | None = None
        self.synth_end: float | None = None
        self.gpu_start: float | None = None
        self.gpu_end: float | None = None


class _JobRecord:
    __slots__ = ("completed_at", "partitions", "proof_kind", "registered_at")

    def __init__(self, proof_kind: str, partitions: int, registered_at: float) -> None:
        self.proof_kind = proof_kind
        self.registered_at = registered_at
        self.completed_at: float | None = None
        self.partitions = [_PartitionRecord() for _ in range(partitions)]


class _WorkerRecord:
    __slots__ = ("busy_since", "busy_total", "current", "gpu_ordinal")

    def __init__(self, gpu_ordinal: int) -> None:
        self.gpu_ordinal = gpu_ordinal
        #: (job_id, partition) of the span in progress, None when idle
        self.current: tuple[str, int] | None = None
        self.busy_since = 0.0
        #: seconds of finished spans
        self.busy_total = 0.0

    def end_span(self, now: float) -> None:
        if self.current is not None:
            self.busy_total += now - self.busy_since
            self.current = None

    def busy_seconds_total(self, now: float) -> float:
        running = now - self.busy_since if self.current is not None else 0.0
        return self.busy_total + running


def _phase_ms(start: float | None, end: float | None, now: float) -> int | None:
    """cuzk's ``synth_ms``/``gpu_ms``: finished duration, elapsed so far, or None."""
    if start is None:
        return None
    return round(((end if end is not None else now) - start) * 1000)


class StatusTracker:
    """Thread-safe status model of one engine (docs/status.md, *Partition and worker rules*).

    Unknown ids and out-of-order transitions are logged at debug level and ignored, but wrong
    argument names or values, such as a negative depth or an unknown buffer field, are
    programming errors and raise.
    """

    def __init__(
        self,
        *,
        budget: MemoryBudgetView | None = None,
        clock: Callable[[], float] = time.monotonic,
        retain_finished_secs: float = 30.0,
    ) -> None:
        self._budget = budget
        self._clock = clock
        self._retain = retain_finished_secs
        # One lock guards everything; the budget is read before taking it, so a budget that
        # calls back into the tracker cannot deadlock.
        self._lock = threading.Lock()
        self._started_at = clock()
        self._workers: dict[int, _WorkerRecord] = {}
        self._jobs: dict[str, _JobRecord] = {}
        #: (completed_at, job_id) in completion order, for O(1) garbage collection
        self._finished: deque[tuple[float, str]] = deque()
        self._jobs_in_flight = 0
        self._kinds = KindCounters()
        self._completed_by_kind: dict[str, int] = {}
        self._failed_by_kind: dict[str, int] = {}
        self._queue_depth = 0
        self._buffers = dict.fromkeys(_BUFFER_FIELDS, 0)
        self._srs: list[Allocation] = []
        self._pce: list[Allocation] = []
        self._gpu_devices: list[GpuDevice] = []
        self._backend = "unknown"
        self._draining = False

    # --- registration ---------------------------------------------------------------------

    def register_workers(self, workers: Iterable[tuple[int, int]]) -> None:
        """Declare GPU workers as (worker_id, gpu_ordinal); re-registering keeps busy totals."""
        with self._lock:
            for worker_id, gpu_ordinal in workers:
                record = self._workers.get(worker_id)
                if record is None:
                    self._workers[worker_id] = _WorkerRecord(gpu_ordinal)
                else:
                    record.gpu_ordinal = gpu_ordinal

    def register_job(self, job_id: str, proof_kind: str, partitions: int) -> None:
        if partitions < 0:
            raise ValueError(f"partitions must be >= 0, got {partitions}")
        with self._lock:
            now = self._clock()
            self._collect_finished(now)
            if job_id in self._jobs:
                _log.debug("status_job_duplicated", job_id=job_id)
                return
            self._jobs[job_id] = _JobRecord(proof_kind, partitions, now)
            self._jobs_in_flight += 1
            self._kinds.ensure_kind(proof_kind)

    # --- partition lifecycle --------------------------------------------------------------

    def partition_synth_start(self, job_id: str, partition: int) -> None:
        with self._lock:
            found = self._advance(job_id, partition, PartitionState.SYNTHESIZING)
            if found is not None:
                found[1].synth_start = self._clock()

    def partition_synth_end(self, job_id: str, partition: int) -> None:
        with self._lock:
            found = self._advance(job_id, partition, PartitionState.SYNTH_DONE)
            if found is not None:
                job, part = found
                part.synth_end = self._clock()
                if part.synth_start is not None:  # always: synth_done requires synthesizing
                    self._kinds.observe_synth(job.proof_kind, part.synth_end - part.synth_start)

    def partition_gpu_start(self, job_id: str, partition: int, worker_id: int) -> None:
        """``worker_id`` starts the GPU phase; a span it still holds ends now (split proving)."""
        with self._lock:
            worker = self._worker(worker_id, job_id, partition)
            if worker is None:
                return
            found = self._advance(job_id, partition, PartitionState.GPU)
            if found is None:
                return
            now = self._clock()
            found[1].gpu_start = now
            worker.end_span(now)
            worker.current = (job_id, partition)
            worker.busy_since = now

    def partition_gpu_end(self, job_id: str, partition: int, worker_id: int) -> None:
        """The partition is done; the worker goes idle only if this is still its current one."""
        with self._lock:
            now = self._clock()
            found = self._advance(job_id, partition, PartitionState.DONE)
            if found is not None:
                job, part = found
                part.gpu_end = now
                if part.gpu_start is not None:  # always: done requires gpu
                    self._kinds.observe_gpu(job.proof_kind, now - part.gpu_start)
            worker = self._worker(worker_id, job_id, partition)
            if worker is not None and worker.current == (job_id, partition):
                worker.end_span(now)

    def partition_failed(self, job_id: str, partition: int) -> None:
        """Fail from any non-terminal phase; freezes the running phase's duration and ends the
        span of a worker whose current partition this is."""
        with self._lock:
            found = self._advance(job_id, partition, PartitionState.FAILED)
            if found is None:
                return
            now = self._clock()
            part = found[1]
            if part.synth_start is not None and part.synth_end is None:
                part.synth_end = now
            if part.gpu_start is not None and part.gpu_end is None:
                part.gpu_end = now
            key = (job_id, partition)
            for worker in self._workers.values():
                if worker.current == key:
                    worker.end_span(now)

    def job_completed(self, job_id: str, proof_kind: str, success: bool) -> None:
        """Count a finished job (partitioned or not) and start its retention period."""
        with self._lock:
            now = self._clock()
            job = self._jobs.get(job_id)
            if job is not None:
                if job.completed_at is not None:
                    _log.debug("status_completion_repeated", job_id=job_id)
                    return
                job.completed_at = now
                self._jobs_in_flight -= 1
                self._kinds.observe_job(job.proof_kind, now - job.registered_at)
                self._finished.append((now, job_id))
            by_kind = self._completed_by_kind if success else self._failed_by_kind
            by_kind[proof_kind] = by_kind.get(proof_kind, 0) + 1
            self._collect_finished(now)

    # --- gauges set by the engine ---------------------------------------------------------

    def set_queue_depth(self, depth: int) -> None:
        if depth < 0:
            raise ValueError(f"queue depth must be >= 0, got {depth}")
        with self._lock:
            self._queue_depth = depth

    def set_buffers(self, **counts: int) -> None:
        """Set some of cuzk's ``buffers`` fields (others keep their value)."""
        unknown = sorted(set(counts) - set(_BUFFER_FIELDS))
        if unknown:
            raise TypeError(f"unknown buffer fields {unknown}; known: {list(_BUFFER_FIELDS)}")
        negative = sorted(name for name, value in counts.items() if value < 0)
        if negative:
            raise ValueError(f"buffer counts must be >= 0: {negative}")
        with self._lock:
            self._buffers.update(counts)

    def set_allocations(self, *, srs: Sequence[Allocation], pce: Sequence[Allocation]) -> None:
        with self._lock:
            self._srs = list(srs)
            self._pce = list(pce)

    def set_gpu_devices(self, devices: Sequence[GpuDevice]) -> None:
        with self._lock:
            self._gpu_devices = list(devices)

    def set_backend(self, backend: str) -> None:
        with self._lock:
            self._backend = backend

    def set_draining(self, draining: bool) -> None:
        with self._lock:
            self._draining = draining

    # --- the document ---------------------------------------------------------------------

    def snapshot(self) -> StatusDocument:
        """cuzk's document (same fields, types, meanings) with ``cuzkd_extensions`` filled;
        its cost is linear in jobs x partitions."""
        memory, max_concurrent = self._read_budget()
        with self._lock:
            now = self._clock()
            self._collect_finished(now)
            pipelines, synth_active = self._pipelines(now)
            return StatusDocument(
                uptime_secs=now - self._started_at,
                memory=memory,
                synthesis=Synthesis(max_concurrent=max_concurrent, active=synth_active),
                pipelines=pipelines,
                gpu_workers=self._gpu_workers(now),
                allocations=Allocations(srs=list(self._srs), pce=list(self._pce)),
                counters=Counters(
                    total_completed=sum(self._completed_by_kind.values()),
                    total_failed=sum(self._failed_by_kind.values()),
                    completed_by_kind=dict(self._completed_by_kind),
                    failed_by_kind=dict(self._failed_by_kind),
                    queue_depth=self._queue_depth,
                ),
                buffers=Buffers(**self._buffers),
                cuzkd_extensions=Extensions(
                    phase_transitions=self._kinds.phase_transitions(),
                    worker_busy=[
                        WorkerBusyTotal(
                            worker_id=worker_id,
                            gpu_ordinal=worker.gpu_ordinal,
                            busy_seconds_total=worker.busy_seconds_total(now),
                        )
                        for worker_id, worker in sorted(self._workers.items())
                    ],
                    synth_duration_seconds=self._kinds.synth_histograms(),
                    gpu_duration_seconds=self._kinds.gpu_histograms(),
                    jobs_in_flight=self._jobs_in_flight,
                    gpu_devices=list(self._gpu_devices),
                    backend=self._backend,
                    draining=self._draining,
                    job_duration_seconds=self._kinds.job_histograms(),
                ),
            )

    # --- internals (called with the lock held) --------------------------------------------

    def _read_budget(self) -> tuple[Memory, int]:
        if self._budget is None:
            return Memory(total_bytes=0, used_bytes=0, available_bytes=0), 0
        total = self._budget.total_bytes()
        used = self._budget.used_bytes()
        memory = Memory(total_bytes=total, used_bytes=used, available_bytes=max(0, total - used))
        return memory, self._budget.max_concurrent_synthesis()

    def _advance(
        self, job_id: str, partition: int, target: PartitionState
    ) -> tuple[_JobRecord, _PartitionRecord] | None:
        """Move a partition to ``target`` and count the entry, or log why not and return None."""
        job = self._jobs.get(job_id)
        if job is None or not 0 <= partition < len(job.partitions):
            _log.debug("status_partition_unknown", job_id=job_id, partition=partition,
                       transition=str(target))
            return None
        part = job.partitions[partition]
        required = _REQUIRED_PREVIOUS.get(target)
        allowed = part.state not in TERMINAL_STATES if required is None else part.state == required
        if not allowed:
            _log.debug("status_transition_out_of_order", job_id=job_id, partition=partition,
                       state=str(part.state), transition=str(target))
            return None
        part.state = target
        self._kinds.entered(job.proof_kind, target)
        return job, part

    def _worker(self, worker_id: int, job_id: str, partition: int) -> _WorkerRecord | None:
        worker = self._workers.get(worker_id)
        if worker is None:
            _log.debug("status_worker_unknown", worker_id=worker_id, job_id=job_id,
                       partition=partition)
        return worker

    def _collect_finished(self, now: float) -> None:
        """Drop jobs completed more than ``retain_finished_secs`` ago (counters stay)."""
        horizon = now - self._retain
        while self._finished and self._finished[0][0] < horizon:
            _, job_id = self._finished.popleft()
            del self._jobs[job_id]

    def _pipelines(self, now: float) -> tuple[list[Pipeline], int]:
        pipelines: list[Pipeline] = []
        synth_active = 0
        for job_id, job in self._jobs.items():
            partitions: list[Partition] = []
            done = 0
            for index, part in enumerate(job.partitions):
                if part.state == PartitionState.DONE:
                    done += 1
                elif part.state == PartitionState.SYNTHESIZING:
                    synth_active += 1
                partitions.append(Partition(
                    index=index,
                    state=part.state,
                    synth_ms=_phase_ms(part.synth_start, part.synth_end, now),
                    gpu_ms=_phase_ms(part.gpu_start, part.gpu_end, now),
                ))
            pipelines.append(Pipeline(
                job_id=job_id,
                proof_kind=job.proof_kind,
                started_secs_ago=now - job.registered_at,
                total_partitions=len(job.partitions),
                partitions_done=done,
                partitions=partitions,
            ))
        return pipelines, synth_active

    def _gpu_workers(self, now: float) -> list[GpuWorker]:
        workers: list[GpuWorker] = []
        for worker_id, worker in sorted(self._workers.items()):
            current = worker.current
            workers.append(GpuWorker(
                worker_id=worker_id,
                gpu_ordinal=worker.gpu_ordinal,
                state=WorkerState.IDLE if current is None else WorkerState.PROVING,
                current_job=None if current is None else current[0],
                current_partition=None if current is None else current[1],
                busy_secs=None if current is None else now - worker.busy_since,
            ))
        return workers
