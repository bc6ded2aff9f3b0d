"""Our fast encoders write exactly what prometheus_client's encoders write."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from cuzkd.metrics.collector import SampleCollector
from cuzkd.metrics.exposition import encode_openmetrics, encode_text
from cuzkd.metrics.http import self_collectors
from cuzkd.metrics.sample import SupervisorSample


class Fixed:
    """A collector returning the same families each time (process metrics would change)."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def frozen_registry(sample):
    families = [f for c in (SampleCollector(sample), *self_collectors()) for f in c.collect()]
    odd = GaugeMetricFamily("odd_values", 'help with \\ and "quotes"\nand a newline',
                            labels=["v"])
    odd.add_metric(['back\\slash "quoted"\nnewline'], float("inf"))
    odd.add_metric(["big"], 123456789.0)
    registry = CollectorRegistry()
    registry.register(Fixed([*families, odd]))
    return registry


def test_byte_identical_to_prometheus_client(example_status, example_extensions, make_engine):
    sample = SupervisorSample(
        engines=[make_engine("e0", status=example_status, extensions=example_extensions,
                             exits_total={"signal_SIGKILL": 1}, release="r1"),
                 make_engine("e1", status=None)],
        zombies_reaped_total=1, active_release="r1")
    registry = frozen_registry(sample)
    text = encode_text(registry.collect())
    assert b"cuzk_partition_synth_duration_seconds_bucket" in text
    assert text == generate_latest(registry)
    assert encode_openmetrics(registry.collect()) == generate_openmetrics(registry)
