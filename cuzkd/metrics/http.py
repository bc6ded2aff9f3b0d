"""The ``GET /metrics`` handler mounted on the supervisor's metrics listener.

Placeholder until the metrics issue lands: answers 503 so the route exists.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from cuzkd.metrics.sample import SupervisorSample

SampleProvider = Callable[[], Awaitable[SupervisorSample]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_metrics_handler(provider: SampleProvider) -> Handler:
    """Return an aiohttp handler that samples the supervisor and renders the exposition."""

    async def handle(request: web.Request) -> web.StreamResponse:
        del request
        await provider()
        raise web.HTTPServiceUnavailable(text="metrics not implemented yet")

    return handle
