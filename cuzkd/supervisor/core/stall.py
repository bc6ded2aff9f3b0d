"""The stall watchdog: an engine that answers its health check but has stopped making progress.

A hung CUDA kernel or a deadlocked worker leaves ``/status`` answering while nothing moves, so
the ordinary health check never fires. :class:`StallWatch` is fed successful health polls, the
monotonic ``now`` and the document, and decides purely whether the engine has had work and no
progress for too long, or a worker busy on one partition for too long. :meth:`StallWatch.observe`
returns the evidence once, at the onset; ``stalled`` stays True while the stall lasts and
``stalls_total`` counts onsets. What counts as work and progress, and the limits, are
docs/supervisor.md, *The stall watchdog* and *Failed-work leftovers*.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import msgspec

from cuzkd.status.document import (
    TERMINAL_STATES,
    Extensions,
    Histogram,
    Partition,
    PartitionState,
    StatusDocument,
    WorkerState,
)

#: Limit multiplier before the first progress after a (re)start.
STARTUP_FACTOR = 3.0
#: A worker's span may last this many times its proof kind's GPU-phase p99 ...
BUSY_P99_FACTOR = 10.0
#: ... but never less than this (seconds) ...
MIN_BUSY_LIMIT = 300.0
#: ... and the p99 counts only once the histogram has this many observations.
MIN_OBSERVATIONS = 20



class StallReason(enum.StrEnum):
    """Which limit a stall passed: the ``reason`` of the ``engine_stalled`` log event."""

    #: work and no progress for ``stall_after`` (its startup multiple before the first)
    NO_PROGRESS = "no_progress"
    #: a worker on one partition longer than its proof kind's busy limit
    WORKER_BUSY_TOO_LONG = "worker_busy_too_long"


@dataclass(frozen=True)
class BusySpan:
    worker: int
    job: str
    partition: int
    proof_kind: str
    busy_seconds: float


@dataclass(frozen=True)
class StallEvidence:
    """What the structured ``engine_stalled`` log event reports."""

    reason: StallReason
    #: the limit that was exceeded, seconds
    limit_seconds: float
    #: seconds since the last progress (or since work appeared / the process started)
    since_progress_seconds: float
    #: partitions listed now, per phase (plain-string keys: the log event shows the dict)
    phases: dict[str, int]
    #: None when the engine's value did not decode
    queue_depth: int | None
    #: the longest running busy span, None when no worker is busy
    oldest_busy: BusySpan | None


def gpu_p99(histogram: Histogram | None) -> float | None:
    """Upper bound of the bucket holding the 99th percentile; None under MIN_OBSERVATIONS,
    ``inf`` when it lies beyond the last bound."""
    if histogram is None or histogram.count < MIN_OBSERVATIONS:
        return None
    rank = 0.99 * histogram.count
    for bound, cumulative in zip(histogram.bounds, histogram.bucket_counts, strict=False):
        if cumulative >= rank:
            return bound
    return math.inf


def busy_limit(histogram: Histogram | None) -> float:
    """How long a worker may prove one partition of a kind with this GPU-phase histogram."""
    p99 = gpu_p99(histogram)
    return MIN_BUSY_LIMIT if p99 is None else max(BUSY_P99_FACTOR * p99, MIN_BUSY_LIMIT)


def has_work(doc: StatusDocument) -> bool:
    """Jobs queued or partitions unfinished (a queue depth that did not decode shows none)."""
    return (doc.counters.queue_depth or 0) > 0 or any(
        part.state not in TERMINAL_STATES for p in doc.pipelines for part in p.partitions)


class StallWatch:
    """Stall decisions for one engine; ``after`` = 0 turns the watchdog off."""

    def __init__(self, after: float) -> None:
        self.after = after
        self.stalls_total = 0
        self.stalled = False
        self._started_at = 0.0
        #: job id -> its partitions as last listed (None before the first document)
        self._listed: dict[str, list[Partition]] | None = None
        self._spans: dict[int, tuple[str, int] | None] = {}
        self._transitions: int | None = None
        self._last_progress: float | None = None
        self._work_since: float | None = None

    def started(self, now: float) -> None:
        """A new process: forget the old one's pipeline; the startup grace begins."""
        self.stalled = False
        self._started_at = now
        self._listed = None
        self._spans = {}
        self._transitions = None
        self._last_progress = None
        self._work_since = None

    def observe(self, now: float, doc: StatusDocument, ext: Extensions | None,
                ) -> StallEvidence | None:
        """Fold one successful poll in; the evidence at the onset of a stall, else None."""
        if self.after <= 0:
            return None
        stale_jobs = [] if ext is None else ext.stale_jobs
        stale = frozenset(job.job_id for job in stale_jobs)
        doc = without_failed_work(
            doc, frozenset(job.job_id for job in stale_jobs if job.failed_partitions),
            frozenset(() if ext is None else ext.phantom_busy_workers))
        if self._progressed(doc, ext, stale):
            self._last_progress = now
        if not has_work(doc):
            self._work_since = None
            self.stalled = False
            return None
        if self._work_since is None:
            self._work_since = now
        evidence = self._evidence(now, doc, ext)
        if evidence is None:
            self.stalled = False
            return None
        if self.stalled:
            return None
        self.stalled = True
        self.stalls_total += 1
        return evidence

    # -- internals -----------------------------------------------------------------------

    def _progressed(self, doc: StatusDocument, ext: Extensions | None,
                    stale: frozenset[str]) -> bool:
        listed: dict[str, list[Partition]] = {}
        for p in doc.pipelines:  # a job listed twice: its entries together, the later wins
            listed[p.job_id] = [*listed[p.job_id], *p.partitions] if p.job_id in listed \
                else p.partitions
        spans = {w.worker_id: (w.current_job, w.current_partition)
                 if w.state == WorkerState.PROVING and w.current_job is not None
                 and w.current_partition is not None else None
                 for w in doc.gpu_workers}
        transitions = (None if ext is None else  # a count that did not decode adds nothing
                       sum(n for phases in ext.phase_transitions.values()
                           for n in phases.values() if n is not None))
        previous, previous_spans = self._listed, self._spans
        previous_transitions = self._transitions
        self._listed, self._spans, self._transitions = listed, spans, transitions
        if previous is None:
            return False  # the first document after a start is the baseline
        if (transitions is not None and previous_transitions is not None
                and transitions > previous_transitions):
            return True
        # A job listed exactly as last time (most jobs of a busy engine) changed nothing; only
        # the others are compared partition by partition.
        for job, parts in listed.items():
            before = previous.get(job)
            if before == parts:
                continue
            was = {} if before is None else _states(before)
            if any(was.get(index, PartitionState.PENDING) != state
                   for index, state in _states(parts).items()):
                return True  # a partition in a new phase, or first seen past pending
        for job, before in previous.items():
            still = listed.get(job)
            if still == before or job in stale:
                continue  # unchanged, or gone stale: failed work, not a partition moving on
            now = {} if still is None else _states(still)
            if any(index not in now and state not in TERMINAL_STATES
                   for index, state in _states(before).items()):
                return True  # a partition left the list unfinished
        return any(span is not None and spans.get(worker) != span
                   for worker, span in previous_spans.items())

    def _evidence(self, now: float, doc: StatusDocument, ext: Extensions | None,
                  ) -> StallEvidence | None:
        assert self._work_since is not None  # set by observe() before this is called
        since = max(self._work_since, self._last_progress if self._last_progress is not None
                    else self._started_at)
        limit = self.after if self._last_progress is not None else STARTUP_FACTOR * self.after
        oldest = _oldest_busy(doc)
        if now - since >= limit:
            return self._build(StallReason.NO_PROGRESS, limit, now - since, doc, oldest)
        age = now - self._started_at
        histograms = {} if ext is None else ext.gpu_duration_seconds
        kinds = {p.job_id: p.proof_kind for p in doc.pipelines}
        for w in doc.gpu_workers:
            if w.state != WorkerState.PROVING or w.busy_secs is None or w.current_job is None:
                continue
            kind_limit = busy_limit(histograms.get(kinds.get(w.current_job, "")))
            # No span is older than the process: a larger busy_secs is the document's error.
            if min(w.busy_secs, age) >= kind_limit:
                return self._build(StallReason.WORKER_BUSY_TOO_LONG, kind_limit, now - since,
                                   doc, oldest)
        return None

    @staticmethod
    def _build(reason: StallReason, limit: float, since: float, doc: StatusDocument,
               oldest: BusySpan | None) -> StallEvidence:
        phases = {state.value: 0 for state in PartitionState}
        for p in doc.pipelines:
            for part in p.partitions:
                phases[part.state] += 1
        return StallEvidence(reason=reason, limit_seconds=limit, since_progress_seconds=since,
                             phases=phases, queue_depth=doc.counters.queue_depth,
                             oldest_busy=oldest)


def without_failed_work(doc: StatusDocument, failed: frozenset[str],
                        phantom: frozenset[int]) -> StatusDocument:
    """The document without the ``failed`` jobs, its phantom-busy workers shown idle."""
    if not failed and not phantom:
        return doc
    return msgspec.structs.replace(
        doc,
        pipelines=[p for p in doc.pipelines if p.job_id not in failed],
        gpu_workers=[msgspec.structs.replace(w, state=WorkerState.IDLE, current_job=None,
                                             current_partition=None, busy_secs=None)
                     if w.worker_id in phantom else w for w in doc.gpu_workers])


def _states(parts: list[Partition]) -> dict[int, PartitionState]:
    """Partition index -> phase (a partition listed twice: the later entry)."""
    return {part.index: part.state for part in parts}


def _oldest_busy(doc: StatusDocument) -> BusySpan | None:
    kinds = {p.job_id: p.proof_kind for p in doc.pipelines}
    busy = [w for w in doc.gpu_workers if w.state == WorkerState.PROVING and w.busy_secs is not None
            and w.current_job is not None and w.current_partition is not None]
    if not busy:
        return None
    w = max(busy, key=lambda w: w.busy_secs or 0.0)
    assert w.current_job is not None and w.current_partition is not None
    return BusySpan(worker=w.worker_id, job=w.current_job, partition=w.current_partition,
                    proof_kind=kinds.get(w.current_job, ""), busy_seconds=w.busy_secs or 0.0)
