"""The ``GET /metrics`` handler mounted on the supervisor's metrics listener.

Each scrape awaits a fresh :class:`SupervisorSample` from the supervisor, then renders it with a
fresh registry holding the sample's collector and the supervisor's own process, platform and GC
collectors (built once: they read ``/proc`` and ``gc`` at collect time). The format follows the
``Accept`` header (OpenMetrics when asked, Prometheus text otherwise), gzip follows
``Accept-Encoding``; :mod:`cuzkd.metrics.exposition` writes the bytes. Rendering runs on the
event loop: ~20 ms for 8 busy engines (docs/benchmarks.md), and it needs the GIL anyway, so a
thread would not let the loop run any sooner.
"""

from __future__ import annotations

import gzip
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import structlog
from aiohttp import hdrs, web
from aiohttp.typedefs import LooseHeaders
from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from cuzkd.metrics.carry import CounterCarry
from cuzkd.metrics.collector import SampleCollector
from cuzkd.metrics.exposition import encode_openmetrics, encode_text
from cuzkd.metrics.sample import SupervisorSample

SampleProvider = Callable[[], Awaitable[SupervisorSample]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Answers a request with a body and headers (the supervisor's listener sends in bounded
#: slices: cuzkd.supervisor.web.outbox)
BodySender = Callable[[web.Request, bytes, LooseHeaders], Awaitable[web.StreamResponse]]

#: gzip level for responses: level 9 (prometheus_client's) costs several times level 5 for a
#: few per cent of size on metric text.
_GZIP_LEVEL = 5

_log = structlog.get_logger("cuzkd.metrics")


@dataclass(frozen=True)
class Exposition:
    """A rendered scrape: body bytes and the headers that describe them."""

    body: bytes
    content_type: str
    gzipped: bool


def self_collectors() -> list[Collector]:
    """The supervisor process's own ``process_*`` and ``python_*`` collectors (unregistered)."""
    # GCCollector insists on registering somewhere: give it a throwaway registry.
    return [ProcessCollector(registry=None), PlatformCollector(registry=None),
            GCCollector(registry=CollectorRegistry())]


def collect(sample: SupervisorSample, extra: Sequence[Collector] = (),
            carry: CounterCarry | None = None) -> Iterable[Metric]:
    """Every family of ``sample`` and the ``extra`` collectors, with ``carry``'s counts added
    (the counters of the program this one replaced: ``cuzkd upgrade``)."""
    registry = CollectorRegistry()
    registry.register(SampleCollector(sample))
    for collector in extra:
        registry.register(collector)
    return registry.collect() if carry is None else carry.apply(registry.collect())


def render(sample: SupervisorSample, *, accept: str, accept_encoding: str,
           extra: Sequence[Collector] = (), carry: CounterCarry | None = None) -> Exposition:
    """Render ``sample`` (and the ``extra`` collectors) in the format the headers ask for."""
    families = collect(sample, extra, carry)
    # prometheus_client negotiates (format, version, escaping); our encoders write the bytes.
    _, content_type = choose_encoder(accept)
    openmetrics = content_type.startswith("application/openmetrics-text")
    body = (encode_openmetrics if openmetrics else encode_text)(families)
    if gzip_accepted(accept_encoding):
        return Exposition(gzip.compress(body, compresslevel=_GZIP_LEVEL), content_type, True)
    return Exposition(body, content_type, False)


async def _whole(request: web.Request, body: bytes,
                 headers: LooseHeaders) -> web.StreamResponse:
    del request
    return web.Response(body=body, headers=headers)


def make_metrics_handler(provider: SampleProvider, send: BodySender = _whole,
                         collectors: Sequence[Collector] = (),
                         carry: CounterCarry | None = None) -> Handler:
    """Return an aiohttp handler that samples the supervisor and renders the exposition
    (with ``collectors``, the supervisor's long-lived ones: the front doors'; and ``carry``'s
    counts, after ``cuzkd upgrade``), answered through ``send`` (by default one ``Response``).

    A sample or rendering failure answers 500 with a short text and is logged with its
    traceback: Prometheus then records ``up == 0`` for the supervisor, which is the truth.
    """
    own = [*self_collectors(), *collectors]

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            sample = await provider()
            out = render(sample, accept=request.headers.get(hdrs.ACCEPT, ""),
                         accept_encoding=request.headers.get(hdrs.ACCEPT_ENCODING, ""),
                         extra=own, carry=carry)
        except Exception as exc:
            _log.exception("metrics_scrape_failed")
            return web.Response(status=500, text=f"metrics unavailable: {type(exc).__name__}\n")
        headers = {hdrs.CONTENT_TYPE: out.content_type, hdrs.VARY: "Accept, Accept-Encoding"}
        if out.gzipped:
            headers[hdrs.CONTENT_ENCODING] = "gzip"
        return await send(request, out.body, headers)

    return handle
