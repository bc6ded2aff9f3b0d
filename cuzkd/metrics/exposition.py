"""Fast encoders for the Prometheus text format and OpenMetrics 1.0, for our own collectors.

prometheus_client's encoders validate and escape every label *name* of every sample against
regular expressions, which is most of a scrape's cost with 8 busy engines (about 11 µs per
sample, ~2,000 samples: docs/benchmarks.md). Every metric and label name we emit is a constant
that is valid in the legacy charset, so that work never changes a byte; these encoders skip it
and produce output byte-identical to ``prometheus_client.exposition.generate_latest`` and
``prometheus_client.openmetrics.exposition.generate_latest`` (a test compares them).

Preconditions, true of :class:`~cuzkd.metrics.collector.SampleCollector` and of
prometheus_client's process, platform and GC collectors: legacy-valid names, no timestamps,
no exemplars, no native histograms, no ``_created`` samples. Any escaping scheme a scraper
negotiates leaves legacy-valid names unchanged, so one output serves them all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

_go_float: Callable[[float], str] = floatToGoString

#: Text-format TYPE names for OpenMetrics types that format lacks.
_TEXT_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram",
               "unknown": "untyped"}


def _escape_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


#: Rendered ``name="value"`` pairs and values by their inputs. A scrape repeats the same few
#: label pairs (engine, proof_kind, phase, le, ...) and values (0, small counts) hundreds of
#: times; looking them up costs a fraction of formatting them again. Label values are bounded
#: by design (no job ids), and the caches are cleared past a size as a backstop.
_PAIRS: dict[tuple[str, str], str] = {}
_FLOATS: dict[float, str] = {}
_CACHE_MAX = 20_000


def _pair(item: tuple[str, str]) -> str:
    if len(_PAIRS) >= _CACHE_MAX:
        _PAIRS.clear()
    text = _PAIRS[item] = f'{item[0]}="{_escape_value(item[1])}"'
    return text


def _value(value: float) -> str:
    if value == 0:  # -0.0 == 0.0 as a key: never cached, decided by the sign
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    text = _go_float(value)
    if value == value:  # NaN is never found again: not worth a slot
        if len(_FLOATS) >= _CACHE_MAX:
            _FLOATS.clear()
        _FLOATS[value] = text
    return text


def _sample_line(sample: Sample) -> str:
    name, labels, value = sample.name, sample.labels, sample.value
    text = _FLOATS.get(value) or _value(value)
    if labels:
        get = _PAIRS.get
        pairs = ",".join([get(item) or _pair(item) for item in sorted(labels.items())])
        return f"{name}{{{pairs}}} {text}\n"
    return f"{name} {text}\n"


def render_samples(samples: Iterable[Sample]) -> str:
    """The lines the encoders write for ``samples`` (the same in both formats)."""
    return "".join(map(_sample_line, samples))


class RenderedHistogramFamily(HistogramMetricFamily):
    """A histogram family whose samples come with their lines already rendered.

    Histograms are most of a busy scrape's lines (an engine x proof kind x ~20 buckets) and
    rarely change between scrapes, so their callers keep each histogram's lines keyed on its
    content (:mod:`cuzkd.metrics.engine_metrics`) and add them with :meth:`add_rendered`; the
    encoders write ``rendered`` instead of formatting ``samples`` again. ``samples`` stays
    complete (prometheus_client's own encoders, and tests, read it).
    """

    def __init__(self, name: str, documentation: str, labels: list[str]) -> None:
        super().__init__(name, documentation, labels=labels)
        self.rendered: list[str] = []

    def add_rendered(self, samples: list[Sample], text: str) -> None:
        """Append ``samples`` and their lines (``text`` must be :func:`render_samples` of them)."""
        self.samples.extend(samples)
        self.rendered.append(text)


def _sample_lines(metric: Metric) -> Iterable[str]:
    if isinstance(metric, RenderedHistogramFamily):
        return metric.rendered
    return map(_sample_line, metric.samples)


def encode_text(families: Iterable[Metric]) -> bytes:
    """Prometheus text format 0.0.4 (also valid as 1.0.0 for legacy-valid names)."""
    out: list[str] = []
    for metric in families:
        name = metric.name
        if metric.type == "counter":
            name += "_total"
        elif metric.type == "info":
            name += "_info"
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} "
                   f"{_TEXT_TYPES.get(metric.type, metric.type)}\n")
        out.extend(_sample_lines(metric))
    return "".join(out).encode()


def encode_openmetrics(families: Iterable[Metric]) -> bytes:
    """OpenMetrics 1.0.0 text, ending in ``# EOF``."""
    out: list[str] = []
    for metric in families:
        name = metric.name
        out.append(f"# HELP {name} {_escape_value(metric.documentation)}\n"
                   f"# TYPE {name} {metric.type}\n")
        if metric.unit:
            out.append(f"# UNIT {name} {metric.unit}\n")
        out.extend(_sample_lines(metric))
    out.append("# EOF\n")
    return "".join(out).encode()
