"""Cumulative per-proof-kind accounting shared by the tracker and the deriver.

Both the reference engine's :class:`~cuzkd.status.tracker.StatusTracker` (which sees every
transition) and :class:`~cuzkd.status.derive.ExtensionDeriver` (which reconstructs them from
polls of a plain cuzk document) produce the same extension figures: phase-entry counts and
phase-duration histograms per proof kind. Keeping the accumulation here means both sides agree
on bucket semantics and on which series exist.

Not thread-safe on its own: each owner guards it with its own lock.
"""

from __future__ import annotations

from bisect import bisect_left

from cuzkd.labelbudget import LabelBudget
from cuzkd.status.document import (
    COUNTED_PHASES,
    DURATION_BUCKETS,
    JOB_DURATION_BUCKETS,
    Histogram,
    PartitionState,
)


class HistogramAccumulator:
    """A fixed-bucket histogram over ``bounds`` (phase durations by default).

    Counts are kept per bucket (not cumulative) so an observation is one increment; the
    cumulative ``le`` form Prometheus wants is built only when a snapshot is taken.
    """

    __slots__ = ("_bounds", "_counts", "_sum")

    def __init__(self, bounds: tuple[float, ...] = DURATION_BUCKETS) -> None:
        self._bounds = bounds
        # one slot per bound plus the +Inf overflow bucket
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        value = max(0.0, seconds)
        # bisect_left: a value equal to a bound belongs to that bound's bucket (``le``)
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def freeze(self) -> Histogram:
        cumulative: list[int] = []
        running = 0
        for count in self._counts[:-1]:
            running += count
            cumulative.append(running)
        return Histogram(
            bounds=list(self._bounds),
            bucket_counts=cumulative,
            count=running + self._counts[-1],
            sum=self._sum,
        )


class KindCounters:
    """Phase-entry counters, phase-duration and job-duration histograms, keyed by proof kind.

    A kind gets all its series (zeros included) the first time it is seen, so a consumer's
    ``rate()`` has a starting point before the first increment. With a ``budget`` (the
    supervisor's deriver: the kinds come from an engine), a kind it refuses is not counted and
    keeps no memory; without (the reference engine's tracker), its kinds are its own.
    """

    __slots__ = ("_budget", "_gpu", "_jobs", "_phases", "_synth")

    def __init__(self, budget: LabelBudget | None = None) -> None:
        self._budget = budget
        self._phases: dict[str, dict[str, int]] = {}
        self._synth: dict[str, HistogramAccumulator] = {}
        self._gpu: dict[str, HistogramAccumulator] = {}
        self._jobs: dict[str, HistogramAccumulator] = {}

    def ensure_kind(self, kind: str) -> bool:
        """Give ``kind`` its counters if it has none; False when the budget refuses it."""
        if kind in self._phases:
            return True
        if self._budget is not None and not self._budget.admits(kind):
            return False
        self._phases[kind] = dict.fromkeys(COUNTED_PHASES, 0)
        self._synth[kind] = HistogramAccumulator()
        self._gpu[kind] = HistogramAccumulator()
        self._jobs[kind] = HistogramAccumulator(JOB_DURATION_BUCKETS)
        return True

    def entered(self, kind: str, phase: PartitionState) -> None:
        """Count one partition entering ``phase`` (one of COUNTED_PHASES)."""
        if self.ensure_kind(kind):
            self._phases[kind][phase] += 1

    def observe_synth(self, kind: str, seconds: float) -> None:
        if self.ensure_kind(kind):
            self._synth[kind].observe(seconds)

    def observe_gpu(self, kind: str, seconds: float) -> None:
        if self.ensure_kind(kind):
            self._gpu[kind].observe(seconds)

    def observe_job(self, kind: str, seconds: float) -> None:
        """One finished job's end-to-end duration."""
        if self.ensure_kind(kind):
            self._jobs[kind].observe(seconds)

    def phase_transitions(self) -> dict[str, dict[str, int | None]]:
        return {kind: dict(phases) for kind, phases in self._phases.items()}

    def synth_histograms(self) -> dict[str, Histogram]:
        return {kind: acc.freeze() for kind, acc in self._synth.items()}

    def gpu_histograms(self) -> dict[str, Histogram]:
        return {kind: acc.freeze() for kind, acc in self._gpu.items()}

    def job_histograms(self) -> dict[str, Histogram]:
        return {kind: acc.freeze() for kind, acc in self._jobs.items()}
