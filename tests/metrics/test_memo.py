"""What a scrape reuses from the previous one is keyed on content: a changed document always
gives the new values, and the bytes stay those prometheus_client would write."""

from __future__ import annotations

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from cuzkd.metrics.collector import SampleCollector
from cuzkd.metrics.exposition import encode_openmetrics, encode_text
from cuzkd.metrics.sample import SupervisorSample
from cuzkd.metrics.tally import PhaseTally, partitions_by_phase
from cuzkd.status.document import Histogram, Pipeline

from .conftest import parse, pipeline


def test_phase_tally_follows_every_change_of_the_listing():
    tally = PhaseTally()
    listings = [
        [pipeline("j1", "porep-c2", "gpu", "pending"), pipeline("j2", "snap-update", "done")],
        # the same listing, decoded again (equal, not identical)
        [pipeline("j1", "porep-c2", "gpu", "pending"), pipeline("j2", "snap-update", "done")],
        # j1 moved on, j2 changed kind, j3 appeared, listed twice (the first entry counts)
        [pipeline("j1", "porep-c2", "done", "synthesizing"), pipeline("j2", "window-post", "done"),
         pipeline("j3", "snap-update", "failed"), pipeline("j3", "snap-update", "done")],
        # j1 gone, j2 back to snap-update
        [pipeline("j2", "snap-update", "done")],
        [],
    ]
    for listing in listings:
        assert tally.count(listing) == partitions_by_phase(listing)
    tally.count(listings[2])
    assert tally.count(listings[3]) == {"snap-update": {
        "pending": 0, "synthesizing": 0, "synth_done": 0, "gpu": 0, "done": 1, "failed": 0}}
    assert tally.count([pipeline("j1", "porep-c2", "gpu")])["porep-c2"]["gpu"] == 1


def histogram(counts: list[int], count: int, total: float) -> Histogram:
    return Histogram(bounds=[0.5, 1.0, 2.0], bucket_counts=counts, count=count, sum=total)


def exposition_pair(sample: SupervisorSample) -> tuple[bytes, bytes]:
    """Our text and prometheus_client's for the same collected families."""
    families = list(SampleCollector(sample).collect())
    registry = CollectorRegistry()
    registry.register(type("Fixed", (), {"collect": lambda self: families})())
    assert encode_openmetrics(families) == generate_openmetrics(registry)
    return encode_text(families), generate_latest(registry)


def test_histograms_render_their_current_content_scrape_after_scrape(
        example_status, example_extensions, make_engine):
    # Every change of any part a histogram's lines are made from, then back: each scrape
    # writes exactly what prometheus_client writes for that scrape's samples.
    versions = [
        histogram([1, 2, 2], 3, 2.5),
        histogram([1, 2, 2], 3, 2.5),
        histogram([1, 2, 3], 3, 2.5),          # a bucket
        histogram([1, 2, 3], 4, 2.5),          # the count (+Inf)
        histogram([1, 2, 3], 4, 7.25),         # the sum
        histogram([1, 2, 3], 4, 0.0),
        histogram([1, 2, 3], 4, -0.0),         # equal to 0.0, written differently
        Histogram(bounds=[0.5, 1.5, 2.0], bucket_counts=[1, 2, 3], count=4, sum=0.0),
        Histogram(bounds=[0.5, 2.0, 1.0], bucket_counts=[1, 2, 3], count=4, sum=0.0),  # bad
        histogram([1, 2, 2], 3, 2.5),
    ]
    seen = []
    for version in versions:
        ext = msgspec.structs.replace(example_extensions,
                                      gpu_duration_seconds={"porep-c2": version})
        ours, theirs = exposition_pair(SupervisorSample(
            engines=[make_engine("e0", status=example_status, extensions=ext),
                     make_engine("e1", status=example_status, extensions=example_extensions)],
            zombies_reaped_total=0))
        assert ours == theirs
        seen.append(parse(ours.decode()).named("cuzk_partition_gpu_duration_seconds_count"))
    counts = [dict(s).get((("engine", "e0"), ("proof_kind", "porep-c2"))) for s in seen]
    assert counts == [3, 3, 3, 4, 4, 4, 4, 4, None, 3]


def test_partition_gauges_follow_a_moved_job(example_status, example_extensions, make_engine):
    def gpu_partitions(pipelines: list[Pipeline]) -> float:
        status = msgspec.structs.replace(example_status, pipelines=pipelines)
        ours, theirs = exposition_pair(SupervisorSample(
            engines=[make_engine("memo", status=status, extensions=example_extensions)],
            zombies_reaped_total=0))
        assert ours == theirs
        return parse(ours.decode()).get_value("cuzk_partitions", engine="memo",
                                              proof_kind="porep-c2", phase="gpu")

    assert gpu_partitions([pipeline("j1", "porep-c2", "gpu", "gpu")]) == 2
    assert gpu_partitions([pipeline("j1", "porep-c2", "gpu", "gpu")]) == 2
    assert gpu_partitions([pipeline("j1", "porep-c2", "gpu", "done")]) == 1
    assert gpu_partitions([pipeline("j2", "porep-c2", "done")]) == 0
