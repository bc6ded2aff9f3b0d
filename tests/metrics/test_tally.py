"""The pure reductions behind the exporter, on hand-built data."""

from __future__ import annotations

import math

import msgspec
import pytest

from cuzkd.metrics.tally import (
    bytes_by_circuit,
    first_by,
    histogram_buckets,
    partitions_by_phase,
    proof_kinds,
    unfinished_jobs,
)
from cuzkd.status.document import Allocation, Histogram

from .conftest import pipeline


def test_first_by_keeps_first_occurrence_in_order():
    assert first_by([(1, "a"), (2, "b"), (1, "c"), (3, "d")], lambda t: t[0]) == [
        (1, "a"), (2, "b"), (3, "d")]


def test_partitions_by_phase_counts_all_phases_and_dedupes_jobs():
    jobs = [pipeline("j1", "porep-c2", "done", "gpu", "pending"),
            pipeline("j1", "porep-c2", "done", "done", "done"),  # duplicate id: ignored
            pipeline("j2", "snap-update", "failed")]
    counts = partitions_by_phase(jobs)
    assert counts["porep-c2"] == {"pending": 1, "synthesizing": 0, "synth_done": 0, "gpu": 1,
                               "done": 1, "failed": 0}
    assert counts["snap-update"]["failed"] == 1
    assert sum(counts["snap-update"].values()) == 1


def test_unfinished_jobs_ignores_terminal_jobs():
    jobs = [pipeline("a", "porep-c2", "done", "failed"), pipeline("b", "porep-c2", "done", "gpu"),
            pipeline("b", "porep-c2", "done", "gpu"), pipeline("c", "snap-update", "pending")]
    assert unfinished_jobs(jobs) == 2


def test_proof_kinds_union_is_sorted(example_status, example_extensions):
    doc = msgspec.structs.replace(example_status, pipelines=[])
    assert proof_kinds(doc, None) == ["porep-c2", "snap-update"]
    ext = msgspec.structs.replace(example_extensions, phase_transitions={"window-post": {}})
    assert proof_kinds(doc, ext) == ["porep-c2", "snap-update", "window-post"]


def test_bytes_by_circuit_sums_duplicates():
    def alloc(circuit: str, size: int) -> Allocation:
        return Allocation(circuit_id=circuit, bytes=size, last_used_secs_ago=0.0, evictable=True)

    assert bytes_by_circuit([alloc("a", 1), alloc("b", 5), alloc("a", 2)]) == {"a": 3, "b": 5}


def test_histogram_buckets_end_in_inf():
    h = Histogram(bounds=[0.5, 1.0, 1e6], bucket_counts=[1, 3, 3], count=4, sum=9.0)
    assert histogram_buckets(h) == [("0.5", 1.0), ("1.0", 3.0), ("1e+06", 3.0), ("+Inf", 4.0)]


@pytest.mark.parametrize("bounds,counts,count", [
    ([0.5, 1.0], [1], 1),               # lengths differ
    ([1.0, 0.5], [1, 2], 2),            # bounds not increasing
    ([0.5, 0.5], [1, 2], 2),            # repeated bound
    ([0.5, math.inf], [1, 2], 2),       # +Inf is ours to add
    ([0.5, math.nan], [1, 2], 2),
    ([-1.0, 1.0], [1, 2], 2),           # durations are not negative
    ([0.5, 1.0], [2, 1], 2),            # cumulative counts decrease
    ([0.5, 1.0], [1, 3], 2),            # total below last bucket
])
def test_inconsistent_histograms_are_rejected(bounds, counts, count):
    assert histogram_buckets(Histogram(bounds=bounds, bucket_counts=counts, count=count,
                                       sum=1.0)) is None
