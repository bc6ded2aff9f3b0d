"""Fixtures for the exporter tests: cuzk's example document, sample builders, a parser."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cuzkd.metrics.collector import SampleCollector
from cuzkd.metrics.sample import EngineSample, SupervisorSample
from cuzkd.status.document import (
    DURATION_BUCKETS,
    Extensions,
    GpuDevice,
    Histogram,
    Partition,
    Pipeline,
    StatusDocument,
    WorkerBusyTotal,
    decode_status,
)


class Series(dict[tuple[str, tuple[tuple[str, str], ...]], float]):
    """Parsed exposition: (sample name, sorted label items) -> value."""

    def get_value(self, metric: str, /, **labels: str) -> float:
        return self[(metric, tuple(sorted(labels.items())))]

    def named(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {labels: v for (n, labels), v in self.items() if n == name}

    def of_engine(self, engine: str) -> set[str]:
        """Sample names that carry ``engine=<engine>``."""
        return {n for (n, labels) in self if ("engine", engine) in labels}


@pytest.fixture(scope="session")
def example_status(reference_dir: Path) -> StatusDocument:
    return decode_status((reference_dir / "cuzk-status.example.json").read_bytes())


def pipeline(job_id: str, kind: str, *states: str) -> Pipeline:
    """A listed job whose partitions are in ``states``, in order."""
    parts = [Partition(index=i, state=s, synth_ms=None, gpu_ms=None)  # type: ignore[arg-type]
             for i, s in enumerate(states)]
    return Pipeline(job_id=job_id, proof_kind=kind, started_secs_ago=1.0,
                    total_partitions=len(parts), partitions_done=0, partitions=parts)


def histogram(observations: list[float]) -> Histogram:
    bounds = list(DURATION_BUCKETS)
    counts = [sum(1 for o in observations if o <= b) for b in bounds]
    return Histogram(bounds=bounds, bucket_counts=counts, count=len(observations),
                     sum=sum(observations))


@pytest.fixture(scope="session")
def example_extensions() -> Extensions:
    """Extensions consistent with the example document (porep-c2 and snap-update jobs, 2
    workers)."""
    return Extensions(
        phase_transitions={
            "porep-c2": {"synthesizing": 420, "synth_done": 416, "gpu": 415, "done": 414,
                      "failed": 1},
            "snap-update": {"synthesizing": 256, "synth_done": 256, "gpu": 256, "done": 256},
        },
        worker_busy=[WorkerBusyTotal(worker_id=0, gpu_ordinal=0, busy_seconds_total=512.5),
                     WorkerBusyTotal(worker_id=1, gpu_ordinal=0, busy_seconds_total=498.25)],
        synth_duration_seconds={"porep-c2": histogram([30.1, 30.2, 44.0]),
                                "snap-update": histogram([9.1])},
        gpu_duration_seconds={"porep-c2": histogram([2.15, 2.2]), "snap-update": histogram([0.4])},
        jobs_in_flight=3,
        gpu_devices=[GpuDevice(gpu_ordinal=0, name="NVIDIA H100", used_bytes=60 * 2**30,
                               total_bytes=80 * 2**30, pool_bytes=50 * 2**30,
                               uuid="GPU-5f1c7a2e-0b3d-4c8e-9a61-2d4f8e6b1c03")],
        backend="cupy",
    )


def engine_sample(name: str = "e0", **overrides: Any) -> EngineSample:
    fields: dict[str, Any] = {
        "name": name, "state": "running", "restarts_total": 0, "exits_total": {},
        "start_time_seconds": 1_700_000_000.0, "resident_memory_bytes": 2**30,
        "cpu_seconds_total": 12.5, "status": None, "extensions": None,
        "fetch_duration_seconds": 0.003, "fetch_errors_total": 0,
    }
    fields.update(overrides)
    return EngineSample(**fields)


@pytest.fixture
def make_engine() -> Callable[..., EngineSample]:
    """``make_engine(name, **fields)``: an EngineSample with plausible defaults."""
    return engine_sample


def exposition(sample: SupervisorSample) -> str:
    registry = CollectorRegistry()
    registry.register(SampleCollector(sample))
    return generate_latest(registry).decode()


def parse(text: str) -> Series:
    series = Series()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in series, f"duplicate series {key}"
            series[key] = s.value
    return series


@pytest.fixture
def scrape() -> Callable[[SupervisorSample], Series]:
    """Render a sample through the collector and parse it back: duplicates fail the test."""
    return lambda sample: parse(exposition(sample))


@pytest.fixture
def render_text() -> Callable[[SupervisorSample], str]:
    return exposition
