"""Histogram bucket semantics shared by the tracker and the deriver (Prometheus ``le``)."""

from __future__ import annotations

from cuzkd.status.counters import HistogramAccumulator, KindCounters
from cuzkd.status.document import COUNTED_PHASES, DURATION_BUCKETS


def test_bounds_are_inclusive_cumulative_and_overflow_goes_to_inf_only() -> None:
    acc = HistogramAccumulator()
    for value in (0.005, 0.0051, 1000.0, -1.0):  # a negative duration counts as 0
        acc.observe(value)
    hist = acc.freeze()
    le = dict(zip(hist.bounds, hist.bucket_counts, strict=True))
    assert (le[0.005], le[0.01], le[600.0]) == (2, 3, 3)
    assert (hist.count, hist.sum) == (4, 0.005 + 0.0051 + 1000.0)
    assert hist.bounds == list(DURATION_BUCKETS)


def test_a_kind_gets_all_its_series_at_zero_when_first_seen() -> None:
    kinds = KindCounters()
    kinds.ensure_kind("snap-update")
    kinds.entered("snap-update", "gpu")
    assert kinds.phase_transitions() == {
        "snap-update": dict.fromkeys(COUNTED_PHASES, 0) | {"gpu": 1}}
    assert kinds.synth_histograms()["snap-update"].count == 0
    assert kinds.gpu_histograms()["snap-update"].bucket_counts == [0] * len(DURATION_BUCKETS)
