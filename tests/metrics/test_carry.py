"""Counters across ``cuzkd upgrade``: the old code's counts carried into the new code's
scrapes, series by series, so that none goes down and none is counted twice."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric

from cuzkd.metrics.carry import CounterCarry, carried_samples, read_later


def counter(name: str, *values: tuple[dict[str, str], float]) -> CounterMetricFamily:
    labels = sorted({k for series, _ in values for k in series})
    family = CounterMetricFamily(name, "help", labels=labels)
    for series, value in values:
        family.add_metric([series[k] for k in labels], value)
    return family


def histogram(name: str, buckets: list[tuple[str, float]], total: float) -> Metric:
    family = HistogramMetricFamily(name, "help", labels=["kind"])
    family.add_metric(["porep"], buckets, total)
    return family


def values(families: Iterable[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in families for s in f.samples}


def carry_of(*families: Metric) -> CounterCarry:
    return CounterCarry(carried_samples(families))


def test_the_supervisors_own_counts_restart_at_zero_and_are_carried() -> None:
    carry = carry_of(counter("cuzkd_engine_restarts", ({"engine": "a"}, 4.0)),
                     counter("python_gc_collections", ({"generation": "0"}, 900.0)))
    scraped = values(carry.apply([counter("cuzkd_engine_restarts", ({"engine": "a"}, 1.0)),
                                  counter("python_gc_collections",
                                          ({"generation": "0"}, 12.0))]))
    assert scraped[("cuzkd_engine_restarts_total", (("engine", "a"),))] == 5.0
    assert scraped[("python_gc_collections_total", (("generation", "0"),))] == 912.0


def test_a_count_that_never_restarted_is_not_counted_twice() -> None:
    """The process's CPU time, a count restored by its owner (an engine's restarts): at or
    above the old value, it continued."""
    carry = carry_of(counter("process_cpu_seconds", ({}, 40.0)),
                     counter("cuzkd_engine_exits", ({"engine": "a", "cause": "stopped"}, 2.0)))
    first = values(carry.apply([counter("process_cpu_seconds", ({}, 40.5)),
                                counter("cuzkd_engine_exits",
                                        ({"engine": "a", "cause": "stopped"}, 2.0))]))
    assert first[("process_cpu_seconds_total", ())] == 40.5
    assert first[("cuzkd_engine_exits_total", (("cause", "stopped"), ("engine", "a")))] == 2.0
    later = values(carry.apply([counter("cuzkd_engine_exits",
                                        ({"engine": "a", "cause": "stopped"}, 3.0))]))
    assert later[("cuzkd_engine_exits_total", (("cause", "stopped"), ("engine", "a")))] == 3.0


def test_a_supervisor_series_absent_at_the_first_scrape_was_reset_when_it_comes_back() -> None:
    """An exit cause seen before the upgrade and again after: the new code counted it from
    zero, so its 1 is 1 more, even though 1 is not below the old value."""
    carry = carry_of(counter("cuzkd_engine_exits", ({"engine": "a", "cause": "exit_1"}, 1.0)))
    assert not values(carry.apply([counter("cuzkd_engine_exits")]))
    later = values(carry.apply([counter("cuzkd_engine_exits",
                                        ({"engine": "a", "cause": "exit_1"}, 1.0))]))
    assert later[("cuzkd_engine_exits_total", (("cause", "exit_1"), ("engine", "a")))] == 2.0


def test_an_engines_own_series_is_decided_when_it_first_appears() -> None:
    """A bundled engine's counts continue (its process did); a plain cuzk document's derived
    counts restarted with the new code's reading of it."""
    carry = carry_of(counter("cuzk_jobs_completed", ({"engine": "bundled"}, 50.0),
                             ({"engine": "cuzk"}, 30.0)))
    assert read_later("cuzk_jobs_completed")
    carry.apply([])  # the first scrape: no document read yet
    scraped = values(carry.apply([counter("cuzk_jobs_completed", ({"engine": "bundled"}, 51.0),
                                          ({"engine": "cuzk"}, 1.0))]))
    assert scraped[("cuzk_jobs_completed_total", (("engine", "bundled"),))] == 51.0
    assert scraped[("cuzk_jobs_completed_total", (("engine", "cuzk"),))] == 31.0


def test_the_door_processs_figures_continue_and_its_restarts_are_the_supervisors() -> None:
    assert read_later("cuzkd_door_proofs")
    assert not read_later("cuzkd_door_process_restarts")
    carry = carry_of(counter("cuzkd_door_proofs", ({"door": "d"}, 10.0)),
                     counter("cuzkd_door_process_restarts", ({}, 2.0)))
    scraped = values(carry.apply([counter("cuzkd_door_process_restarts", ({}, 2.0))]))
    assert scraped[("cuzkd_door_process_restarts_total", ())] == 2.0
    scraped = values(carry.apply([counter("cuzkd_door_proofs", ({"door": "d"}, 12.0))]))
    assert scraped[("cuzkd_door_proofs_total", (("door", "d"),))] == 12.0


def test_a_histogram_is_carried_whole_by_its_count() -> None:
    old = histogram("cuzkd_door_hold_duration_seconds",
                    [("1.0", 3.0), ("+Inf", 5.0)], 9.0)
    carry = carry_of(old)
    fresh = histogram("cuzkd_door_hold_duration_seconds", [("1.0", 1.0), ("+Inf", 1.0)], 0.5)
    scraped = values(carry.apply([fresh]))
    kind = (("kind", "porep"),)
    assert scraped[("cuzkd_door_hold_duration_seconds_bucket", (*kind, ("le", "1.0")))] == 4.0
    assert scraped[("cuzkd_door_hold_duration_seconds_bucket", (*kind, ("le", "+Inf")))] == 6.0
    assert scraped[("cuzkd_door_hold_duration_seconds_count", kind)] == 6.0
    assert scraped[("cuzkd_door_hold_duration_seconds_sum", kind)] == 9.5


def test_gauges_pass_as_they_are_and_nothing_is_carried_without_a_handover() -> None:
    gauge = GaugeMetricFamily("cuzkd_engine_up", "help", labels=["engine"])
    gauge.add_metric(["a"], 1.0)
    carry = carry_of(counter("cuzkd_engine_restarts", ({"engine": "a"}, 4.0)), gauge)
    assert values(carry.apply([gauge]))[("cuzkd_engine_up", (("engine", "a"),))] == 1.0
    fresh = counter("cuzkd_engine_restarts", ({"engine": "a"}, 1.0))
    assert values(CounterCarry().apply([fresh])) == values([fresh])
