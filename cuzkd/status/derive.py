"""Approximate cumulative extensions for engines that serve cuzk's plain document.

A real cuzk only shows states at the moment of each poll. :class:`ExtensionDeriver` is fed every
document the supervisor fetches and turns successive observations into the same
:class:`~cuzkd.status.document.Extensions` the bundled engine serves: phase entries, busy
seconds, histograms and job durations, kept only for the kinds and workers the engine's label
budgets admit (:mod:`cuzkd.labelbudget`), reset when the engine restarts. What each figure
misses is docs/status.md, *Derived extensions for a real cuzk (approximations)*, and
docs/metrics.md, *What is approximate for a plain cuzk document*.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from cuzkd.labelbudget import DEFAULT_LIMITS, LabelBudget
from cuzkd.status.counters import KindCounters
from cuzkd.status.document import (
    TERMINAL_STATES,
    Allocation,
    Extensions,
    GpuWorker,
    Partition,
    PartitionState,
    Pipeline,
    StaleJob,
    StatusDocument,
    WorkerBusyTotal,
    WorkerState,
)
from cuzkd.status.failedwork import STALE_AFTER_SECS, JobProgress

#: How far the engine's start time, estimated as ``clock() - uptime_secs``, may move between two
#: observations before it counts as a restart. Covers fetch latency jitter (a document is
#: generated some time before we observe it).
RESTART_SLACK_SECS = 5.0

#: How long an empty ``allocations.srs`` keeps the last non-empty one: a real cuzk serves ``[]``
#: whenever its SRS manager is busy, as during an SRS load (30-90 s), so an empty list means
#: "unknown", not "nothing loaded"; past this it is believed.
SRS_HOLD_SECS = 120.0


class PhantomReason(enum.StrEnum):
    """Why a worker shown ``proving`` is not busy: the ``reason`` label of
    ``cuzk_gpu_worker_phantom_busy_total``."""

    JOB_NOT_LISTED = "job_not_listed"
    #: its job is failed work
    JOB_STALE = "job_stale"
    #: its job lists that partition not in ``gpu``
    PARTITION_NOT_GPU = "partition_not_gpu"


#: Pipeline order without ``pending`` (where partitions start) and ``failed`` (off-pipeline).
_FORWARD: tuple[PartitionState, ...] = (
    PartitionState.SYNTHESIZING, PartitionState.SYNTH_DONE, PartitionState.GPU,
    PartitionState.DONE)
_RANK: dict[PartitionState, int] = {
    p: i for i, p in enumerate((PartitionState.PENDING, *_FORWARD))}
_PAST_SYNTHESIS: frozenset[PartitionState] = frozenset({
    PartitionState.SYNTH_DONE, PartitionState.GPU, PartitionState.DONE})


def reached_rank(part: Partition) -> int:
    """How far along the pipeline a partition provably got (index into pending + _FORWARD).

    For ``failed`` only the durations tell: ``gpu_ms`` set means it entered ``gpu`` (hence
    ``synth_done``), ``synth_ms`` set means it entered ``synthesizing``.
    """
    if part.state != PartitionState.FAILED:
        return _RANK[part.state]
    if part.gpu_ms is not None:
        return _RANK[PartitionState.GPU]
    if part.synth_ms is not None:
        return _RANK[PartitionState.SYNTHESIZING]
    return _RANK[PartitionState.PENDING]


def entered_phases(previous: Partition | None, current: Partition) -> list[PartitionState]:
    """Phases ``current`` entered since ``previous`` was seen (None: never seen). Pure."""
    if previous is not None and previous.state in TERMINAL_STATES:
        return []  # nothing follows done or failed; a change after them is ignored
    seen_rank = 0 if previous is None else reached_rank(previous)
    entered = [p for p in _FORWARD if seen_rank < _RANK[p] <= reached_rank(current)]
    if current.state == PartitionState.FAILED:
        entered.append(PartitionState.FAILED)
    return entered


class _SeenPartition:
    __slots__ = ("gpu_recorded", "last", "synth_recorded")

    def __init__(self, last: Partition) -> None:
        self.last = last
        self.synth_recorded = False
        self.gpu_recorded = False


class _JobClock:
    __slots__ = ("kind", "started")

    def __init__(self, kind: str, started: float | None) -> None:
        self.kind = kind
        #: estimated start (clock time); None once timed, or when first seen finished
        self.started = started


class _SeenJob:
    """A listed job: its partitions as last listed, how many of them were done or failed, and
    what was recorded for each."""

    __slots__ = ("kind", "listed", "partitions", "terminal")

    def __init__(self, kind: str, listed: list[Partition]) -> None:
        self.kind = kind
        self.listed = listed
        self.terminal = 0  # set from ``listed`` by the walk that follows
        self.partitions: dict[int, _SeenPartition] = {}


class _WorkerSpans:
    """One worker's busy time, rebuilt from the spans its polls show.

    A span is a (current_job, current_partition) the worker is seen ``proving``. It is placed
    by ``busy_secs``: it began ``busy_secs`` before the first observation that showed it. It
    ends unseen, between the last poll that showed it and the first that does not, at
    :meth:`_end_of`; the total only grows, and no second is counted in two spans.
    """

    __slots__ = ("current", "finished_secs", "gpu_ordinal", "last_seen", "observed_at",
                 "phantom", "phantom_polls", "started")

    def __init__(self, gpu_ordinal: int) -> None:
        self.gpu_ordinal = gpu_ordinal
        self.current: tuple[str, int] | None = None
        self.started = 0.0  # estimated start of ``current``
        self.last_seen = 0.0  # the last observation that showed ``current``
        self.observed_at = float("-inf")  # the last observation of this worker
        self.finished_secs = 0.0
        #: consecutive polls that showed ``current`` phantom (see :meth:`observe`)
        self.phantom_polls = 0
        #: ``current`` is phantom: shown proving, not busy
        self.phantom = False

    def busy_seconds_total(self) -> float:
        running = self.last_seen - self.started if self.current is not None else 0.0
        return self.finished_secs + (0.0 if self.phantom else running)

    def observe(self, worker: GpuWorker, now: float, gpu_ms: Callable[[str, int], int | None],
                phantom: Callable[[str, int], PhantomReason | None], engine_start: float,
                ) -> PhantomReason | None:
        """Fold in the worker as one document shows it at ``now``; ``gpu_ms`` looks up the
        ``gpu_ms`` of a partition that document lists ``done``, ``phantom`` why a partition is
        not one a worker can be busy with (None: it is in ``gpu`` in a live job). No span
        began before ``engine_start`` (a larger ``busy_secs`` is the document's error).

        A span shown phantom is not seen (its time is not counted past its last genuine
        sighting); on the second poll in a row it ends as if the worker had gone idle, and
        the worker counts as not busy until it shows another span. Returns the reason when
        the span has just been found phantom (once per span).
        """
        self.gpu_ordinal = worker.gpu_ordinal
        previous, self.observed_at = max(self.observed_at, engine_start), now
        span: tuple[str, int] | None = None
        started = now
        if (worker.state == WorkerState.PROVING and worker.current_job is not None
                and worker.current_partition is not None and worker.busy_secs is not None):
            span = (worker.current_job, worker.current_partition)
            started = now - max(0.0, worker.busy_secs)
        reason = None if span is None else phantom(*span)
        if self.current is not None:
            # ``current`` is what the previous observation showed: the same span, unless it
            # restarted (began after that observation)
            if span == self.current and started <= previous:
                return self._same_span(now, gpu_ms, reason)
            self._close(None if span is None else started, now, gpu_ms)
            previous = max(previous, self.last_seen)
        if span is not None:
            # it began after the worker was last seen without it: never one second in two spans
            self.current, self.started = span, max(started, previous)
            self.last_seen = self.started if reason is not None else now
            self.phantom_polls = 0 if reason is None else 1
        return None

    def _same_span(self, now: float, gpu_ms: Callable[[str, int], int | None],
                   reason: PhantomReason | None) -> PhantomReason | None:
        if self.phantom:
            return None  # still shown proving it: still not busy
        if reason is None:
            self.last_seen, self.phantom_polls = now, 0  # the same span, still running
            return None
        self.phantom_polls += 1
        if self.phantom_polls < 2:
            return None
        # it ended at its partition's own end if that is known, else when last seen genuine
        current = self.current
        if current is not None:
            ended = self._partition_end(current, now, gpu_ms)
            self.finished_secs += (self.last_seen if ended is None else ended) - self.started
        self.phantom = True
        return reason

    def _close(self, next_started: float | None, now: float,
               gpu_ms: Callable[[str, int], int | None]) -> None:
        """End the current span (a phantom one has ended already) and add it to the total."""
        if self.current is not None and not self.phantom:
            ended = self._end_of(self.current, next_started, now, gpu_ms)
            self.finished_secs += ended - self.started
            self.last_seen = ended
        self.current, self.phantom, self.phantom_polls = None, False, 0

    def _end_of(self, span: tuple[str, int], next_started: float | None, now: float,
                gpu_ms: Callable[[str, int], int | None]) -> float:
        """When ``span``, last seen at ``last_seen``, ended: it is gone at ``now``.

        It ended by ``now`` and, when the worker shows a span begun since, by the time that one
        began (the engine's rule: a worker is busy until its partition ends or it picks up the
        next one). Within that: at its partition's own end (start + ``gpu_ms``) when the
        document lists it ``done``; else when the next span began (split proving: the worker
        picks the next partition up while a finalizer still holds the last one in ``gpu``);
        else, gone idle at an unknown time, half-way (wrong by at most half a poll interval,
        as often early as late).
        """
        latest = now
        if next_started is not None and next_started > self.last_seen:
            latest = min(latest, next_started)
        ended = self._partition_end(span, latest, gpu_ms)
        if ended is not None:
            return ended
        if latest < now:
            return latest
        return (self.last_seen + latest) / 2

    def _partition_end(self, span: tuple[str, int], latest: float,
                       gpu_ms: Callable[[str, int], int | None]) -> float | None:
        """The span's partition's own end (start + ``gpu_ms``) within [last seen, latest]."""
        finished_ms = gpu_ms(*span)
        if finished_ms is None:
            return None
        return min(max(self.started + finished_ms / 1000, self.last_seen), latest)


class ExtensionDeriver:
    """Reconstructs cumulative extensions from successive plain cuzk documents.

    Not thread-safe: the supervisor observes and reads from its event loop. ``kinds`` and
    ``workers``: the engine's label budgets for ``proof_kind`` and ``worker`` (default: budgets
    of the default limits, this deriver's own).
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 kinds: LabelBudget | None = None, workers: LabelBudget | None = None,
                 stale_after: float = STALE_AFTER_SECS) -> None:
        self._clock = clock
        self._stale_after = stale_after
        self._kind_budget = LabelBudget(DEFAULT_LIMITS["proof_kind"]) if kinds is None else kinds
        self._worker_budget = LabelBudget(DEFAULT_LIMITS["worker"]) if workers is None else workers
        self._reset()

    def _reset(self) -> None:
        self._kinds = KindCounters(self._kind_budget)
        self._jobs: dict[str, _SeenJob] = {}
        self._workers: dict[int, _WorkerSpans] = {}
        self._jobs_in_flight = 0
        self._job_clocks: dict[str, _JobClock] = {}
        self._last_uptime: float | None = None
        self._engine_start: float | None = None
        self._progress = JobProgress(self._stale_after)
        self._stale: dict[str, StaleJob] = {}
        self._phantom_total = {reason.value: 0 for reason in PhantomReason}
        self._srs: list[Allocation] = []  # the last non-empty allocations.srs ...
        self._srs_seen = 0.0  # ... when it was seen
        self._held_srs: list[Allocation] = []

    def observe(self, doc: StatusDocument) -> None:
        """Fold one document into the counters. Observing the same document again is a no-op.

        A document whose ``uptime_secs`` did not decode is folded in all the same, without
        the restart check (and without the "same document" one, which only saves work).
        """
        if doc.uptime_secs is not None:
            if doc.uptime_secs == self._last_uptime:
                return
            engine_start = self._clock() - doc.uptime_secs
            if self._restarted(doc.uptime_secs, engine_start):
                self._reset()
            if self._engine_start is None or engine_start < self._engine_start:
                self._engine_start = engine_start
            self._last_uptime = doc.uptime_secs

        jobs: dict[str, _SeenJob] = {}
        clocks: dict[str, _JobClock] = {}
        stale: dict[str, StaleJob] = {}
        in_flight = 0
        now = self._clock()
        self._progress.begin()
        for pipeline in doc.pipelines:
            if pipeline.job_id in jobs:
                continue  # listed twice: the first entry counts (a second would recount it)
            if self._progress.observe(pipeline, now):  # a retry under the same id: a new job
                self._jobs.pop(pipeline.job_id, None)
                self._job_clocks.pop(pipeline.job_id, None)
            job = jobs[pipeline.job_id] = self._observe_pipeline(pipeline)
            if self._progress.stale(pipeline, now):
                stale[pipeline.job_id] = self._stale_job(pipeline, now)
            # pipeline_in_flight, kept; failed work is not in flight
            running = job.terminal < pipeline.total_partitions and pipeline.job_id not in stale
            in_flight += running
            clocks[pipeline.job_id] = self._time_job(pipeline, running, now)
        self._progress.end()
        for job_id, clock in self._job_clocks.items():
            if job_id not in clocks and clock.started is not None:  # gone before seen finished
                self._kinds.observe_job(clock.kind, now - clock.started)
        self._jobs = jobs
        self._job_clocks = clocks
        self._stale = stale
        self._hold_srs(doc.allocations.srs, now)
        self._observe_workers(doc, now)
        self._jobs_in_flight = in_flight

    def _hold_srs(self, srs: list[Allocation], now: float) -> None:
        """Keep the last non-empty SRS list through up to SRS_HOLD_SECS of empty ones."""
        if srs:
            self._srs, self._srs_seen, self._held_srs = srs, now, []
        else:
            self._held_srs = self._srs if now - self._srs_seen <= SRS_HOLD_SECS else []

    def _observe_workers(self, doc: StatusDocument, now: float) -> None:
        engine_start = float("-inf") if self._engine_start is None else self._engine_start
        seen_workers: set[int] = set()
        for worker in doc.gpu_workers:
            if worker.worker_id in seen_workers:
                continue  # listed twice: two alternating spans would invent busy time
            seen_workers.add(worker.worker_id)
            spans = self._workers.get(worker.worker_id)
            if spans is None:
                if not self._worker_budget.admits(str(worker.worker_id)):
                    continue
                spans = self._workers[worker.worker_id] = _WorkerSpans(worker.gpu_ordinal)
            reason = spans.observe(worker, now, self._finished_gpu_ms, self._phantom_reason,
                                   engine_start)
            if reason is not None:
                self._phantom_total[reason] += 1

    def extensions(self) -> Extensions:
        return Extensions(
            phase_transitions=self._kinds.phase_transitions(),
            worker_busy=[
                WorkerBusyTotal(
                    worker_id=worker_id,
                    gpu_ordinal=spans.gpu_ordinal,
                    busy_seconds_total=spans.busy_seconds_total(),
                )
                for worker_id, spans in sorted(self._workers.items())
            ],
            synth_duration_seconds=self._kinds.synth_histograms(),
            gpu_duration_seconds=self._kinds.gpu_histograms(),
            jobs_in_flight=self._jobs_in_flight,
            gpu_devices=[],
            backend="cuzk",
            job_duration_seconds=self._kinds.job_histograms(),
            stale_jobs=self.stale_jobs(),
            phantom_busy_workers=self.phantom_busy_workers(),
            phantom_busy_total=dict(self._phantom_total),
            held_srs=list(self._held_srs),
        )

    def stale_jobs(self) -> list[StaleJob]:
        """The last document's failed work: its stale jobs."""
        return list(self._stale.values())

    def phantom_busy_workers(self) -> list[int]:
        """Workers the last document shows proving that are not busy."""
        return sorted(worker_id for worker_id, spans in self._workers.items() if spans.phantom)

    def _stale_job(self, pipeline: Pipeline, now: float) -> StaleJob:
        return StaleJob(
            job_id=pipeline.job_id, proof_kind=pipeline.proof_kind,
            age_secs=pipeline.started_secs_ago,
            idle_secs=self._progress.idle_secs(pipeline.job_id, now),
            failed_partitions=sum(1 for p in pipeline.partitions
                                  if p.state == PartitionState.FAILED))

    def _phantom_reason(self, job_id: str, index: int) -> PhantomReason | None:
        """Why a worker shown proving (job_id, index) cannot be busy with it, or None."""
        job = self._jobs.get(job_id)
        if job is None:
            return PhantomReason.JOB_NOT_LISTED
        if job_id in self._stale:
            return PhantomReason.JOB_STALE
        if not any(p.index == index and p.state == PartitionState.GPU for p in job.listed):
            return PhantomReason.PARTITION_NOT_GPU
        return None

    def _finished_gpu_ms(self, job_id: str, index: int) -> int | None:
        """``gpu_ms`` of a partition this document lists ``done``, else None."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        part = next((p for p in job.listed if p.index == index), None)
        return part.gpu_ms if part is not None and part.state == PartitionState.DONE else None

    def _time_job(self, pipeline: Pipeline, running: bool, now: float) -> _JobClock:
        """The job's clock after this observation; its duration is recorded when it finishes."""
        clock = self._job_clocks.get(pipeline.job_id)
        if clock is None:
            started = now - pipeline.started_secs_ago if running else None
            clock = _JobClock(pipeline.proof_kind, started)
        if not running and clock.started is not None:
            self._kinds.observe_job(clock.kind, now - clock.started)
            clock.started = None
        return clock

    def _restarted(self, uptime: float, engine_start: float) -> bool:
        if self._last_uptime is None or self._engine_start is None:
            return False
        return (uptime < self._last_uptime
                or engine_start > self._engine_start + RESTART_SLACK_SECS)

    def _observe_pipeline(self, pipeline: Pipeline) -> _SeenJob:
        kind = pipeline.proof_kind
        job = self._jobs.get(pipeline.job_id)
        if job is not None and job.kind == kind and job.listed == pipeline.partitions:
            # Listed exactly as last time (most jobs of a busy engine between two polls): the
            # walk below would change nothing, as it already ran on these very partitions.
            return job
        self._kinds.ensure_kind(kind)
        if job is None:
            job = _SeenJob(kind, pipeline.partitions)
        job.kind, job.listed = kind, pipeline.partitions
        job.terminal = terminal_partitions(pipeline.partitions)
        seen = job.partitions
        for part in pipeline.partitions:
            record = seen.get(part.index)
            for phase in entered_phases(None if record is None else record.last, part):
                self._kinds.entered(kind, phase)
            if record is None:
                record = seen[part.index] = _SeenPartition(part)
            elif record.last.state not in TERMINAL_STATES and (
                    part.state == PartitionState.FAILED
                    or reached_rank(part) >= reached_rank(record.last)):
                # Never move backwards (a regression would recount later), but always remember
                # a failure: a partition failed after synth_done proves a lower rank than it was
                # seen at, and left unrecorded would count ``failed`` again at every poll.
                record.last = part
            self._record_durations(kind, part, record)
        return job

    def _record_durations(self, kind: str, part: Partition, record: _SeenPartition) -> None:
        synth_finished = part.state in _PAST_SYNTHESIS or (
            part.state == PartitionState.FAILED and part.gpu_ms is not None)
        if not record.synth_recorded and part.synth_ms is not None and synth_finished:
            self._kinds.observe_synth(kind, part.synth_ms / 1000)
            record.synth_recorded = True
        if (not record.gpu_recorded and part.gpu_ms is not None
                and part.state == PartitionState.DONE):
            self._kinds.observe_gpu(kind, part.gpu_ms / 1000)
            record.gpu_recorded = True


def pipeline_in_flight(pipeline: Pipeline) -> bool:
    """A listed job is in flight while fewer of its partitions are done or failed than it has
    (also the exporter's rule for a document without extensions)."""
    return terminal_partitions(pipeline.partitions) < pipeline.total_partitions


def terminal_partitions(partitions: list[Partition]) -> int:
    """Partitions done or failed."""
    return sum(1 for p in partitions if p.state in TERMINAL_STATES)
