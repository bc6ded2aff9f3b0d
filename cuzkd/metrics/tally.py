"""Pure reductions from a status document to the numbers the exporter publishes.

Kept apart from the Prometheus types so each rule (which kinds get series, how duplicates are
merged, when a histogram is garbage) is unit-tested on plain data. An engine may serve anything;
every function here turns a malformed input into fewer series, never into an exception or into
duplicate series, because one bad engine must not break the whole exposition.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from functools import lru_cache
from itertools import pairwise
from typing import NamedTuple, TypeVar

from prometheus_client.utils import floatToGoString

from cuzkd.labelbudget import LabelBudgets
from cuzkd.status.derive import pipeline_in_flight
from cuzkd.status.document import (
    Allocation,
    Extensions,
    Histogram,
    Partition,
    PartitionState,
    Pipeline,
    StatusDocument,
)

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

_go_float: Callable[[float], str] = floatToGoString  # prometheus_client is untyped


@lru_cache(maxsize=16)
def le_labels(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """``le`` values formatted as Prometheus formats them. Every histogram of every engine
    shares the same bounds, so this is computed once, not per bucket per scrape; the cache
    size bounds the memory an engine serving odd bounds can make us use."""
    return tuple(_go_float(b) for b in bounds)


def first_by(items: Iterable[T], key: Callable[[T], K]) -> list[T]:
    """Items with a key not seen before, in order: a duplicated worker keeps its first entry."""
    seen: set[K] = set()
    kept: list[T] = []
    for item in items:
        k = key(item)
        if k not in seen:
            seen.add(k)
            kept.append(item)
    return kept


def proof_kinds(status: StatusDocument, extensions: Extensions | None) -> list[str]:
    """Every proof kind the engine mentions, sorted.

    Taking the union (pipelines, job counters, phase counters) rather than only the kinds with a
    job in flight keeps each kind's series present -- at 0 -- between jobs, so series do not
    flap with the load and ``rate()`` sees the first increment.
    """
    kinds = {p.proof_kind for p in status.pipelines}
    kinds.update(status.counters.completed_by_kind)
    kinds.update(status.counters.failed_by_kind)
    if extensions is not None:
        kinds.update(extensions.phase_transitions)
    return sorted(kinds)


class Admitted(NamedTuple):
    """The label values of one engine's document its label budgets admit for one scrape."""

    #: the proof kinds that get series (all of them, at 0 where not counted), sorted
    kinds: list[str]
    #: the kinds whose histograms are exported (``kinds`` and those only a histogram names)
    histogram_kinds: frozenset[str]
    workers: frozenset[int]
    gpus: frozenset[int]
    circuits: frozenset[str]


def admitted(labels: LabelBudgets, status: StatusDocument,
             extensions: Extensions | None) -> Admitted:
    """Every proof kind, worker, GPU and circuit of the document through ``labels``: each label
    is offered its values once per scrape, sorted (so which values of a first document win
    the slots does not depend on the engine's order), and what is refused is counted once."""
    kinds = proof_kinds(status, extensions)
    histogrammed: set[str] = set()
    workers = {w.worker_id for w in status.gpu_workers}
    gpus: set[int] = set()
    if extensions is not None:
        for histograms in (extensions.synth_duration_seconds, extensions.gpu_duration_seconds,
                           extensions.job_duration_seconds):
            histogrammed.update(histograms)
        workers.update(w.worker_id for w in extensions.worker_busy)
        gpus.update(d.gpu_ordinal for d in extensions.gpu_devices)
    held = () if extensions is None or status.allocations.srs else extensions.held_srs
    circuits = {a.circuit_id for a in (*status.allocations.srs, *held, *status.allocations.pce)}
    offered = kinds if histogrammed.issubset(kinds) else sorted({*kinds, *histogrammed})
    kept_kinds = frozenset(labels.keep("proof_kind", offered, str))
    return Admitted(
        kinds=[kind for kind in kinds if kind in kept_kinds],
        histogram_kinds=kept_kinds,
        workers=frozenset(labels.keep("worker", sorted(workers), str)),
        gpus=frozenset(labels.keep("gpu", sorted(gpus), str)),
        circuits=frozenset(labels.keep("circuit", sorted(circuits), str)))


def partitions_by_phase(pipelines: Iterable[Pipeline],
                        ) -> dict[str, dict[PartitionState, int]]:
    """proof_kind -> phase -> partitions in that phase now; all six phases present, 0 if none.

    A job listed twice (same ``job_id``) is counted once.
    """
    return PhaseTally().count(pipelines)


class PhaseTally:
    """:func:`partitions_by_phase` for one engine, scrape after scrape.

    A busy engine lists hundreds of jobs and most are listed exactly as at the previous scrape
    (the same partitions: equal, and after :class:`~cuzkd.status.document.StatusDecoder` the
    very same list). The tally keeps running totals: a job listed as before costs one
    comparison; a job that changed is taken out of the totals as it was counted and put back
    as it is now; a job no longer listed is taken out. Only the jobs of the latest call are
    remembered, and only the kinds they are of, so memory follows the document.
    """

    def __init__(self) -> None:
        #: job_id -> (proof kind, partitions as counted, phase -> count of its partitions)
        self._jobs: dict[str, tuple[str, list[Partition], dict[PartitionState, int]]] = {}
        #: proof kind -> phase -> partitions, over ``_jobs``; and the jobs of each kind
        self._totals: dict[str, dict[PartitionState, int]] = {}
        self._listed: dict[str, int] = {}

    def count(self, pipelines: Iterable[Pipeline]) -> dict[str, dict[PartitionState, int]]:
        before, jobs = self._jobs, {}
        for pipeline in pipelines:
            job_id = pipeline.job_id
            if job_id in jobs:
                continue  # listed twice: the first entry counts
            memo = before.pop(job_id, None)
            kind, parts = pipeline.proof_kind, pipeline.partitions
            if memo is None or memo[0] != kind or memo[1] != parts:
                if memo is not None:
                    self._add(memo, -1)
                memo = (kind, parts, _phase_counts(parts))
                self._add(memo, 1)
            jobs[job_id] = memo
        for gone in before.values():
            self._add(gone, -1)
        self._jobs = jobs
        return {kind: dict(by_phase) for kind, by_phase in self._totals.items()}

    def _add(self, job: tuple[str, list[Partition], dict[PartitionState, int]],
             sign: int) -> None:
        kind, _, counts = job
        by_phase = self._totals.get(kind)
        if by_phase is None:
            by_phase = self._totals[kind] = dict.fromkeys(PartitionState, 0)
        for phase, n in counts.items():
            by_phase[phase] += sign * n
        listed = self._listed[kind] = self._listed.get(kind, 0) + sign
        if not listed:  # its totals are all 0 now: a kind no job lists keeps no memory
            del self._totals[kind], self._listed[kind]


def _phase_counts(partitions: list[Partition]) -> dict[PartitionState, int]:
    counts: dict[PartitionState, int] = {}
    for partition in partitions:
        counts[partition.state] = counts.get(partition.state, 0) + 1
    return counts


def stale_synthesis(pipelines: Iterable[Pipeline], stale: frozenset[str]) -> int:
    """Of ``synthesis.active``, what failed work holds: its partitions shown
    ``synthesizing``, and those whose synthesis failed (cuzk never takes them off the count).
    Each listed job once."""
    held = 0
    for pipeline in first_by(pipelines, lambda p: p.job_id):
        if pipeline.job_id in stale:
            held += sum(1 for part in pipeline.partitions if _holds_synthesis(part))
    return held


def _holds_synthesis(part: Partition) -> bool:
    """Shown ``synthesizing``, or failed in its synthesis."""
    return part.state == PartitionState.SYNTHESIZING or (
        part.state == PartitionState.FAILED and part.synth_ms is not None and part.gpu_ms is None)


def unfinished_jobs(pipelines: Iterable[Pipeline]) -> int:
    """Jobs with a partition not yet done or failed: ``jobs_in_flight`` when an engine gives no
    extensions (it then misses unpartitioned jobs, which cuzk does not list)."""
    return sum(1 for p in first_by(pipelines, lambda p: p.job_id) if pipeline_in_flight(p))


def bytes_by_circuit(allocations: Iterable[Allocation]) -> dict[str, int]:
    """circuit_id -> bytes; a circuit listed twice is summed (it holds both allocations)."""
    totals: dict[str, int] = {}
    for allocation in allocations:
        totals[allocation.circuit_id] = totals.get(allocation.circuit_id, 0) + allocation.bytes
    return totals


def histogram_buckets(histogram: Histogram) -> list[tuple[str, float]] | None:
    """Prometheus ``le`` buckets ending in ``+Inf``, or None when the histogram is inconsistent.

    Inconsistent means: bounds and counts of different lengths, bounds not finite and strictly
    increasing, a negative bound (durations), cumulative counts decreasing, or a total below
    the last bucket. Publishing such a histogram would make ``histogram_quantile`` lie, so it
    is dropped instead.
    """
    bounds, counts = histogram.bounds, histogram.bucket_counts
    if len(bounds) != len(counts):
        return None
    if any(not math.isfinite(b) for b in bounds) or (bounds and bounds[0] < 0):
        return None
    if any(a >= b for a, b in pairwise(bounds)):
        return None
    if any(a > b for a, b in pairwise(counts)):
        return None
    if counts and histogram.count < counts[-1]:
        return None
    buckets: list[tuple[str, float]] = list(
        zip(le_labels(tuple(bounds)), map(float, counts), strict=True))
    buckets.append(("+Inf", float(histogram.count)))
    return buckets
