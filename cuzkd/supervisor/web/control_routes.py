"""The control API: HTTP on a Unix socket (mode 0600), never on TCP.

Everything that changes state lives here, so only the socket's owner (root under systemd) can
stop or restart engines; the TCP metrics listener is read-only. ``start`` and ``restart``
answer once the engine is ``running`` (200) or could not get there (409 with the reason);
``stop`` once it is stopped. Other packages add routes (``POST /v1/swap``, ``POST
/v1/reload``) through the hooks the composition root wires in. The app acts on a
:class:`~cuzkd.supervisor.web.targets.ControlTarget` (the engine set), never the daemon. Every
error is a JSON ``{"error": "..."}`` with a 4xx/5xx status.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import structlog
from aiohttp import web

from cuzkd.httperrors import json_errors
from cuzkd.supervisor.web.targets import ControlTarget

log = structlog.get_logger("cuzkd.supervisor")

RouteHook = Callable[[web.Application], None]


def build_control_app(supervisor: ControlTarget, describe: Callable[[], dict[str, Any]],
                      release_verdict: Callable[[], dict[str, Any]],
                      hooks: Sequence[RouteHook]) -> web.Application:
    """The control app acting on ``supervisor``; ``describe`` answers ``GET /v1/supervisor``,
    ``release_verdict`` gives ``GET /v1/engines`` the active release and its verdict."""
    app = web.Application(middlewares=[json_errors])

    async def engines(request: web.Request) -> web.Response:
        del request
        return web.json_response({"engines": [i.as_json() for i in supervisor.engines_info()],
                                  "release": release_verdict()})

    async def about(request: web.Request) -> web.Response:
        del request
        return web.json_response(describe())

    async def engine(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not supervisor.has_engine(name):
            return web.json_response({"error": f"no engine named {name!r}"}, status=404)
        return web.json_response(supervisor.engine_info(name).as_json())

    async def action(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        verb = request.match_info["action"]
        if not supervisor.has_engine(name):
            return web.json_response({"error": f"no engine named {name!r}"}, status=404)
        if verb in ("restart", "start") and supervisor.stopping:
            return web.json_response({"error": f"cannot {verb} {name!r}: the supervisor is "
                                               "stopping"}, status=409)
        if verb == "restart":
            await supervisor.restart_engine(name)
            problem = await supervisor.wait_running(name)
        elif verb == "stop":
            problem = await supervisor.stop_engine(name)
        elif verb == "start":
            await supervisor.start_engine(name)
            problem = await supervisor.wait_running(name)
        else:
            return web.json_response({"error": f"unknown action {verb!r} (use start, stop or "
                                               "restart)"}, status=404)
        info = supervisor.engine_info(name).as_json()
        if problem is not None:
            # 409: the engine is not in the state asked for; the body still shows where it is.
            return web.json_response({"error": f"{verb} {name}: {problem}", "engine": info},
                                     status=409)
        return web.json_response(info)

    app.router.add_get("/v1/engines", engines)
    app.router.add_get("/v1/supervisor", about)
    app.router.add_get("/v1/engines/{name}", engine)
    app.router.add_post("/v1/engines/{name}/{action}", action)
    for hook in hooks:
        hook(app)
    return app
