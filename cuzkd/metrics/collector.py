"""A prometheus_client collector over one :class:`SupervisorSample`.

Collection happens at scrape time from data the supervisor just gathered: there are no
long-lived labelled metric objects, so the series of an engine, worker or proof kind that is
gone simply disappear from the next scrape, and nothing grows with the number of jobs. The
collector is built per scrape and holds no state; counters are monotonic because the engines'
figures are (an engine restart is an ordinary counter reset).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import Metric

from cuzkd.metrics.engine_metrics import EngineFamilies
from cuzkd.metrics.sample import SupervisorSample
from cuzkd.metrics.supervisor_metrics import supervisor_families
from cuzkd.metrics.tally import first_by


class SampleCollector:
    """Yields every ``cuzkd_*`` and ``cuzk_*`` family of one sample.

    An engine listed twice under the same name keeps its first entry (two would be duplicate
    series, which Prometheus rejects for the whole scrape). Engines without a fresh status
    document contribute only ``cuzkd_*`` series.
    """

    def __init__(self, sample: SupervisorSample) -> None:
        self._sample = sample

    def collect(self) -> Iterable[Metric]:
        engines = first_by(self._sample.engines, lambda e: e.name)
        per_engine = EngineFamilies()
        for engine in engines:
            if engine.status is not None:
                per_engine.add(engine.name, engine.status, engine.extensions)
        for family in (*supervisor_families(self._sample, engines), *per_engine.families()):
            if family.samples:  # a HELP/TYPE with no series is noise for readers and linters
                yield family
