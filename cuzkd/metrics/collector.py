"""A prometheus_client collector over one :class:`SupervisorSample`.

Collection happens at scrape time from data the supervisor just gathered: there are no
long-lived labelled metric objects, so the series of an engine, worker or proof kind that is
gone simply disappear from the next scrape, and nothing grows with the number of jobs. The
collector is built per scrape and holds no state; counters are monotonic because the engines'
figures are (an engine restart is an ordinary counter reset).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import structlog
from prometheus_client.metrics_core import Metric

from cuzkd.labelbudget import LabelBudgets
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.metrics.engine_metrics import EngineFamilies
from cuzkd.metrics.grpc_metrics import grpc_families
from cuzkd.metrics.sample import SupervisorSample
from cuzkd.metrics.supervisor_metrics import supervisor_families
from cuzkd.metrics.tally import first_by

_log = structlog.get_logger("cuzkd.metrics")
#: one traceback per engine per 10 s, however often Prometheus scrapes
_limited = LimitedLog()


class SampleCollector:
    """Yields every ``cuzkd_*`` and ``cuzk_*`` family of one sample.

    An engine listed twice under the same name keeps its first entry (two would be duplicate
    series, which Prometheus rejects for the whole scrape). Engines without a fresh status
    document contribute only ``cuzkd_*`` series; so does an engine whose document the
    conversion fails on (logged with its traceback): it is exported as not answering
    (``cuzkd_engine_up 0``), and the other engines' series are unaffected. Each engine's
    ``cuzk_*`` label values pass through its label budgets (``EngineSample.labels``).
    """

    def __init__(self, sample: SupervisorSample) -> None:
        self._sample = sample

    def collect(self) -> Iterable[Metric]:
        engines = first_by(self._sample.engines, lambda e: e.name)
        per_engine = EngineFamilies()
        for i, engine in enumerate(engines):
            status, labels = engine.status, engine.labels
            if status is None:
                continue
            if labels is None:  # budgets for this scrape alone, and what they drop counted
                labels = LabelBudgets(engine.name)
                engines[i] = engine = dataclasses.replace(engine, labels=labels)
            try:
                per_engine.add(engine.name, status, engine.extensions, labels,
                               max_parallel_synthesis=engine.max_parallel_synthesis)
            except Exception:
                _limited.log(_log, "error", "metrics_engine_failed", key=engine.name,
                             engine=engine.name, exc_info=True)
                engines[i] = dataclasses.replace(engine, status=None, extensions=None)
        for family in (*supervisor_families(self._sample, engines), *per_engine.families(),
                       *grpc_families(engines)):
            if family.samples:  # a HELP/TYPE with no series is noise for readers and linters
                yield family
