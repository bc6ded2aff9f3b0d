"""The ``cuzk_*`` families: one engine's status document (and extensions) as Prometheus series.

One :class:`EngineFamilies` is built per scrape and fed every engine that answered, so each
family is created once and holds all engines' series (the exposition lists a family once, with
its HELP and TYPE). Every series carries ``engine``; none carries a job id or a partition index,
so the series count depends on engines, workers, GPUs, proof kinds and circuits -- never on the
number of jobs processed.

Label values are the engine's own strings (proof kinds, circuit ids); prometheus_client escapes
them. How many distinct ones an engine gets is bounded by its label budgets
(:mod:`cuzkd.labelbudget`): every proof kind, worker, GPU and circuit passes through them
(:func:`~cuzkd.metrics.tally.admitted`), so one engine naming 100,000 kinds costs its own
excess series, not the host's scrape. An engine that stops answering simply has no ``cuzk_*``
series in that scrape.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import NamedTuple

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from cuzkd.config.cuzkfile import synthesis_capacity
from cuzkd.labelbudget import LabelBudgets, attribute_value
from cuzkd.metrics.exposition import RenderedHistogramFamily, render_samples
from cuzkd.metrics.tally import (
    Admitted,
    PhaseTally,
    admitted,
    bytes_by_circuit,
    first_by,
    histogram_buckets,
    stale_synthesis,
    unfinished_jobs,
)
from cuzkd.status.derive import PhantomReason
from cuzkd.status.document import (
    COUNTED_PHASES,
    Allocation,
    Extensions,
    Histogram,
    PartitionState,
    StatusDocument,
    WorkerState,
)

_E = ["engine"]
_WORKER = ["engine", "worker", "gpu"]
_KIND = ["engine", "proof_kind"]
_KIND_PHASE = ["engine", "proof_kind", "phase"]
_GPU = ["engine", "gpu"]

#: cuzk's ``buffers`` fields counted as in-flight buffers, by ``buffer`` label value.
_BUFFERS: tuple[tuple[str, str], ...] = (
    ("synth", "synth_in_flight"),
    ("provers", "provers_in_flight"),
    ("aux", "aux_in_flight"),
    ("shells", "shells_in_flight"),
)
#: Of those, the fields a real cuzk never decrements (docs/status.md): from its own document
#: they count buffers ever put in flight, a counter (``cuzk_buffers_started_total``), never a
#: gauge that climbs for good. The reference engine's own are true in-flight counts.
_NEVER_DECREMENTED = frozenset(("aux", "shells"))


class EngineFamilies:
    """Accumulates the ``cuzk_*`` families of every engine for one scrape."""

    def __init__(self) -> None:
        g, c = GaugeMetricFamily, CounterMetricFamily
        self.uptime = g("cuzk_engine_uptime_seconds", "Seconds since the engine started.",
                        labels=_E)
        self.backend = InfoMetricFamily(
            "cuzk_engine_backend",
            "Compute backend of a cuzkd reference engine (cupy, numpy); cuzk for a plain cuzk.",
            labels=_E)
        self.worker_busy = g("cuzk_gpu_worker_busy",
                             "1 while the GPU worker proves a partition, 0 when idle.",
                             labels=_WORKER)
        self.worker_current = g(
            "cuzk_gpu_worker_current_busy_seconds",
            "Length of the worker's running busy span, 0 when idle.", labels=_WORKER)
        self.worker_busy_total = c(
            "cuzk_gpu_worker_busy_seconds_total",
            "Seconds the GPU worker spent proving, including the running span.", labels=_WORKER)
        self.transitions = c(
            "cuzk_partition_phase_transitions_total",
            "Partitions that entered each phase since the engine started.", labels=_KIND_PHASE)
        self.partitions = g(
            "cuzk_partitions",
            "Partitions in each phase over the jobs the engine lists now "
            "(in flight or finished less than 30 s ago).", labels=_KIND_PHASE)
        self.synth_duration = RenderedHistogramFamily(
            "cuzk_partition_synth_duration_seconds",
            "Duration of finished partition synthesis phases.", labels=_KIND)
        self.gpu_duration = RenderedHistogramFamily(
            "cuzk_partition_gpu_duration_seconds",
            "Duration of finished partition GPU phases.", labels=_KIND)
        self.job_duration = RenderedHistogramFamily(
            "cuzk_job_duration_seconds",
            "End-to-end duration of finished jobs, accepted to finished (approximate for a "
            "plain cuzk: first seen to done or gone).", labels=_KIND)
        self.jobs_completed = c("cuzk_jobs_completed_total", "Jobs that completed successfully.",
                                labels=_KIND)
        self.jobs_failed = c("cuzk_jobs_failed_total", "Jobs that failed.", labels=_KIND)
        self.jobs_in_flight = g("cuzk_jobs_in_flight", "Jobs accepted and not finished.",
                                labels=_E)
        self.stale_jobs = g(
            "cuzk_stale_jobs",
            "Listed jobs that are leftovers of failed work (a failed partition, or no progress "
            "for stale_job_after): not in flight, queued or synthesizing.", labels=_KIND)
        self.phantom_busy = c(
            "cuzk_gpu_worker_phantom_busy_total",
            "Spans of GPU workers shown proving a partition not in gpu in a live job, two polls "
            "in a row (counted as not busy), by reason.", labels=["engine", "reason"])
        self.queue_depth = g("cuzk_queue_depth", "Jobs waiting in the engine's scheduler.",
                             labels=_E)
        self.budget_total = g("cuzk_memory_budget_total_bytes",
                              "Size of the engine's host-memory budget.", labels=_E)
        self.budget_used = g("cuzk_memory_budget_used_bytes",
                             "Host-memory budget in use (SRS, PCE, synthesis working set).",
                             labels=_E)
        self.budget_available = g("cuzk_memory_budget_available_bytes",
                                  "Host-memory budget still available.", labels=_E)
        self.synth_active = g("cuzk_synthesis_active", "Partitions synthesizing now.", labels=_E)
        self.synth_max = g("cuzk_synthesis_max_concurrent",
                           "Partitions the memory budget allows to synthesize at once.",
                           labels=_E)
        self.synth_capacity = g(
            "cuzk_synthesis_capacity",
            "Partitions the engine really synthesizes at once (a cuzk: max(2, min(budget / "
            "14 GiB, [pipeline] max_parallel_synthesis)); cuzkd's engine: its max_concurrent).",
            labels=_E)
        self.allocation = g("cuzk_allocation_bytes",
                            "Long-lived allocations by kind (srs, pce) and circuit.",
                            labels=["engine", "kind", "circuit"])
        self.buffers = g("cuzk_buffers_in_flight", "Buffers in flight by pipeline stage.",
                         labels=["engine", "buffer"])
        self.buffers_started = c(
            "cuzk_buffers_started",
            "Buffers a plain cuzk put in flight since it started (aux, shells: fields it never "
            "decrements).", labels=["engine", "buffer"])
        self.pending_handles = g("cuzk_pending_handles", "Proof handles awaiting collection.",
                                 labels=_E)
        self.gpu_used = g("cuzk_gpu_memory_used_bytes", "Device memory in use (driver view).",
                          labels=_GPU)
        self.gpu_total = g("cuzk_gpu_memory_total_bytes", "Device memory size.", labels=_GPU)
        self.gpu_pool = g("cuzk_gpu_memory_pool_bytes",
                          "Device memory held by the engine's allocator pool.", labels=_GPU)
        self.gpu_info = InfoMetricFamily("cuzk_gpu", "Device name and UUID of each GPU ordinal "
                                         "(join cuzkd_gpu_info on uuid).",
                                         labels=_GPU)

    def add(self, engine: str, status: StatusDocument, extensions: Extensions | None,
            labels: LabelBudgets, *, max_parallel_synthesis: int | None = None) -> None:
        """Add one engine's series. ``extensions`` falls back to the document's own block;
        ``labels``: the engine's label budgets; ``max_parallel_synthesis``: a cuzk engine's,
        from its config (its real synthesis capacity follows from it and the budget).

        All or nothing: when the conversion raises (a supervisor bug met by one engine's
        values), none of the engine's series stay in the families and the exception
        propagates, so that the caller can leave that engine out and export the others.
        """
        marks = [(family, len(family.samples),
                  len(family.rendered) if isinstance(family, RenderedHistogramFamily) else 0)
                 for family in self.families()]
        try:
            self._add_engine(engine, status, extensions, labels)
            _put(self.synth_capacity, [engine], _capacity(status, max_parallel_synthesis))
        except Exception:
            for family, samples, rendered in marks:
                del family.samples[samples:]
                if isinstance(family, RenderedHistogramFamily):
                    del family.rendered[rendered:]
            _PHASE_TALLIES.pop(engine, None)  # it may have stopped halfway through a count
            raise

    def _add_engine(self, engine: str, status: StatusDocument, extensions: Extensions | None,
                    labels: LabelBudgets) -> None:
        ext = status.cuzkd_extensions if extensions is None else extensions
        kept = admitted(labels, status, ext)
        self._add_document(engine, status, kept, FailedWork.of(ext))
        if ext is not None:
            self._add_extensions(engine, ext, kept)
        jobs_in_flight = unfinished_jobs(status.pipelines) if ext is None else ext.jobs_in_flight
        _put(self.jobs_in_flight, [engine], jobs_in_flight)

    def families(self) -> list[Metric]:
        return [value for value in vars(self).values() if isinstance(value, Metric)]

    def _add_document(self, engine: str, status: StatusDocument, kept: Admitted,
                      failed_work: FailedWork) -> None:
        e, kinds = [engine], kept.kinds
        _put(self.uptime, e, status.uptime_secs)
        for worker in first_by(status.gpu_workers, lambda w: w.worker_id):
            if worker.worker_id not in kept.workers:
                continue
            labels = [engine, str(worker.worker_id), str(worker.gpu_ordinal)]
            proving = (worker.state == WorkerState.PROVING
                       and worker.worker_id not in failed_work.phantom)
            self.worker_busy.add_metric(labels, 1 if proving else 0)
            current = worker.busy_secs if proving and worker.busy_secs is not None else 0.0
            self.worker_current.add_metric(labels, current)
        by_phase = _phase_tally(engine).count(
            p for p in status.pipelines if p.job_id not in failed_work.stale)
        for kind in kinds:
            for phase, count in by_phase.get(kind, _NO_PARTITIONS).items():
                self.partitions.add_metric([engine, kind, phase], count)
        counters = status.counters
        for kind in kinds:  # a kind the engine has not counted yet is at 0
            _put(self.jobs_completed, [engine, kind], counters.completed_by_kind.get(kind, 0))
            _put(self.jobs_failed, [engine, kind], counters.failed_by_kind.get(kind, 0))
        _put(self.queue_depth, e, counters.queue_depth)
        memory = status.memory
        _put(self.budget_total, e, memory.total_bytes)
        _put(self.budget_used, e, memory.used_bytes)
        _put(self.budget_available, e, memory.available_bytes)
        active = status.synthesis.active
        _put(self.synth_active, e, None if active is None else max(
            0, active - stale_synthesis(status.pipelines, failed_work.stale)))
        _put(self.synth_max, e, status.synthesis.max_concurrent)
        # a plain cuzk's [] means "SRS manager busy": the deriver holds the last list a while
        srs = status.allocations.srs or failed_work.held_srs
        for kind, allocations in (("srs", srs), ("pce", status.allocations.pce)):
            for circuit, size in sorted(bytes_by_circuit(allocations).items()):
                if circuit in kept.circuits:
                    self.allocation.add_metric([engine, kind, circuit], size)
        plain = status.cuzkd_extensions is None
        for label, field in _BUFFERS:
            family = self.buffers_started if plain and label in _NEVER_DECREMENTED \
                else self.buffers
            _put(family, [engine, label], getattr(status.buffers, field))
        _put(self.pending_handles, e, status.buffers.pending_handles)

    def _add_extensions(self, engine: str, ext: Extensions, kept: Admitted) -> None:
        for busy in first_by(ext.worker_busy, lambda w: w.worker_id):
            if busy.worker_id not in kept.workers:
                continue
            labels = [engine, str(busy.worker_id), str(busy.gpu_ordinal)]
            self.worker_busy_total.add_metric(labels, busy.busy_seconds_total)
        stale_by_kind = Counter(job.proof_kind for job in ext.stale_jobs)
        for kind in kept.kinds:
            self.stale_jobs.add_metric([engine, kind], stale_by_kind.get(kind, 0))
        for reason, spans in sorted(ext.phantom_busy_total.items()):
            if reason in _PHANTOM_REASONS:
                self.phantom_busy.add_metric([engine, reason], spans)
        for kind in kept.kinds:
            entered = ext.phase_transitions.get(kind, {})
            for phase in COUNTED_PHASES:
                _put(self.transitions, [engine, kind, phase], entered.get(phase, 0))
        for family, histograms in ((self.synth_duration, ext.synth_duration_seconds),
                                   (self.gpu_duration, ext.gpu_duration_seconds),
                                   (self.job_duration, ext.job_duration_seconds)):
            _add_histograms(family, engine, histograms, kept.histogram_kinds)
        for device in first_by(ext.gpu_devices, lambda d: d.gpu_ordinal):
            if device.gpu_ordinal not in kept.gpus:
                continue
            labels = [engine, str(device.gpu_ordinal)]
            self.gpu_used.add_metric(labels, device.used_bytes)
            self.gpu_total.add_metric(labels, device.total_bytes)
            self.gpu_pool.add_metric(labels, device.pool_bytes)
            self.gpu_info.add_metric(labels, {"name": attribute_value(device.name),
                                              "uuid": attribute_value(device.uuid)})
        self.backend.add_metric([engine], {"backend": attribute_value(ext.backend)})


class FailedWork(NamedTuple):
    """What the deriver corrects in a plain cuzk's document: the stale jobs' ids, the
    phantom-busy workers and the SRS list held through an empty one (none for an engine
    serving its own extensions)."""

    stale: frozenset[str]
    phantom: frozenset[int]
    held_srs: list[Allocation]

    @classmethod
    def of(cls, ext: Extensions | None) -> FailedWork:
        if ext is None:
            return cls(frozenset(), frozenset(), [])
        return cls(frozenset(job.job_id for job in ext.stale_jobs),
                   frozenset(ext.phantom_busy_workers), ext.held_srs)


def _capacity(status: StatusDocument, max_parallel_synthesis: int | None) -> int | None:
    """Partitions the engine really synthesizes at once. A plain cuzk document's
    ``max_concurrent`` (budget / 9 GiB) is not cuzk's cap: that follows from the budget and
    its config's ``max_parallel_synthesis`` (cuzk's default when cuzkd has no cuzk file for
    it). An engine serving cuzkd's extensions reports its own cap."""
    if status.cuzkd_extensions is not None:
        return status.synthesis.max_concurrent
    budget = status.memory.total_bytes
    return None if budget is None else synthesis_capacity(budget, max_parallel_synthesis or 0)


def _put(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str],
         value: float | None) -> None:
    """One series, or none for a value the engine served that did not decode (None)."""
    if value is not None:
        family.add_metric(labels, value)


#: A proof kind with no job listed now still gets all six phases, at 0.
_NO_PARTITIONS: dict[PartitionState, int] = dict.fromkeys(PartitionState, 0)
#: The reasons exported: another key of an engine's own extensions gets no series.
_PHANTOM_REASONS: frozenset[str] = frozenset(PhantomReason)


#: What survives from one scrape to the next, keyed on content so that a change is always seen:
#: each engine's partition counts per job (:class:`PhaseTally`), and each histogram's samples
#: and rendered lines with the histogram they were made from. Keys are bounded by the engines,
#: proof kinds and families (never by jobs); cleared past a size as a backstop.
_PHASE_TALLIES: dict[str, PhaseTally] = {}
_HISTOGRAMS: dict[tuple[str, str, str], tuple[object, list[Sample], str]] = {}
_MEMO_MAX = 4096


def _phase_tally(engine: str) -> PhaseTally:
    tally = _PHASE_TALLIES.get(engine)
    if tally is None:
        if len(_PHASE_TALLIES) >= _MEMO_MAX:
            _PHASE_TALLIES.clear()
        tally = _PHASE_TALLIES[engine] = PhaseTally()
    return tally


def _histogram_content(histogram: Histogram) -> object:
    """Everything the samples of ``histogram`` are made from (the sign of a zero sum too:
    ``-0.0 == 0.0`` but they render differently)."""
    return (tuple(histogram.bounds), tuple(histogram.bucket_counts), histogram.count,
            histogram.sum, math.copysign(1.0, histogram.sum))


def _add_histograms(family: RenderedHistogramFamily, engine: str,
                    histograms: dict[str, Histogram], kinds: frozenset[str]) -> None:
    """Append the ``_bucket``, ``_count`` and ``_sum`` samples of each valid histogram of one
    of ``kinds``.

    Appended directly rather than through ``HistogramMetricFamily.add_metric``, which rebuilds
    each bucket's label dict through ``zip``; and a histogram equal to the one this engine
    served for the kind at the previous scrape reuses that one's samples and lines.
    """
    for kind in sorted(kinds.intersection(histograms)):
        histogram = histograms[kind]
        key = (family.name, engine, kind)
        content = _histogram_content(histogram)
        memo = _HISTOGRAMS.get(key)
        if memo is None or memo[0] != content:
            samples = _histogram_samples(family.name, engine, kind, histogram)
            if samples is None:
                continue
            if len(_HISTOGRAMS) >= _MEMO_MAX:
                _HISTOGRAMS.clear()
            memo = _HISTOGRAMS[key] = (content, samples, render_samples(samples))
        family.add_rendered(memo[1], memo[2])


def _histogram_samples(name: str, engine: str, kind: str,
                       histogram: Histogram) -> list[Sample] | None:
    buckets = histogram_buckets(histogram)
    if buckets is None:
        return None
    labels = {"engine": engine, "proof_kind": kind}
    samples = [Sample(name + "_bucket", {**labels, "le": le}, n) for le, n in buckets]
    samples.append(Sample(name + "_count", labels, buckets[-1][1]))
    samples.append(Sample(name + "_sum", labels, histogram.sum))
    return samples
