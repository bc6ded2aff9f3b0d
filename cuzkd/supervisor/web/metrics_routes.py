"""The read-only TCP listener: ``/metrics``, ``/status`` and ``/healthz``.

``/healthz`` answers 200 for as long as the supervisor runs (its engines' health is in
``/status`` and the metrics, not here: a load balancer should not drop a host because one GPU's
engine is restarting). ``/status`` is the supervisor's state plus each engine's last status
document; ``/metrics`` is the exporter's handler. Both bodies leave through the
:class:`~cuzkd.supervisor.web.outbox.Outbox`: in slices, within its budget and deadline.
``access`` (:class:`~cuzkd.supervisor.web.access.WebAccess`) asks for basic auth first, on every
route but ``/healthz``, and adds the web config's headers to every response.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import hdrs, web
from prometheus_client.registry import Collector

from cuzkd.httperrors import json_errors
from cuzkd.metrics.carry import CounterCarry
from cuzkd.metrics.http import make_metrics_handler
from cuzkd.supervisor.web.access import WebAccess
from cuzkd.supervisor.web.outbox import Outbox
from cuzkd.supervisor.web.targets import ScrapeTarget

_JSON = {hdrs.CONTENT_TYPE: "application/json; charset=utf-8"}


def build_metrics_app(supervisor: ScrapeTarget, outbox: Outbox, access: WebAccess,
                      collectors: Sequence[Collector] = (),
                      carry: CounterCarry | None = None) -> web.Application:
    """``collectors``: the supervisor's own long-lived collectors, rendered with each scrape's
    sample (the front doors' :class:`~cuzkd.metrics.door_metrics.DoorMetrics`); ``carry``: the
    counts of the program this one replaced (``cuzkd upgrade``)."""
    app = web.Application(middlewares=[access.guard, json_errors])
    app.on_response_prepare.append(access.add_headers)

    async def healthz(request: web.Request) -> web.Response:
        del request
        return web.json_response({"status": "ok"})

    async def status(request: web.Request) -> web.StreamResponse:
        return await outbox.send(request, await supervisor.status_body(), _JSON)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics",
                       make_metrics_handler(supervisor.sample, outbox.send, collectors, carry))
    return app
