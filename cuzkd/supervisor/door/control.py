"""The doors on the supervisor's control socket: ``GET /v1/doors`` (each door, its engines,
its held calls and the request ids it has quarantined) and ``POST /v1/doors/release``
(``{"request_id": "..."}``: end a quarantine, as ``cuzkd door release ID`` does).

A quarantined id is a request that crashed an engine twice, the second time with no other
suspect beside it (docs/door.md): the door refuses it ``FAILED_PRECONDITION`` until its
``[door] quarantine`` ends. An operator who has fixed the engine, or believes the crashes were
chance, releases it here. Request ids are the caller's text (brackets and spaces in
WindowPoSt ids), so the id travels in a JSON body, never in the path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from aiohttp import web

from cuzkd.httperrors import error_response, read_body
from cuzkd.supervisor.door.relay import Door


class ReleaseRequest(msgspec.Struct, forbid_unknown_fields=True):
    request_id: str


def door_routes(doors: Callable[[], Sequence[Door]],
                clock: Callable[[], float]) -> Callable[[web.Application], None]:
    """The routes' hook: ``doors`` gives the supervisor's doors, ``clock`` the doors' clock
    (quarantines end on it; the answer gives wall times)."""

    def described(door: Door) -> dict[str, Any]:
        now, wall = clock(), time.time()
        return {"name": door.plan.name, "address": door.plan.address,
                "engines": list(door.plan.engines), "held_calls": door.held_calls,
                "quarantined": [{"request_id": q.job, "engine": q.engine,
                                 "since": wall - (now - q.since),
                                 "until": wall + (q.until - now)}
                                for q in door.quarantined()]}

    async def listing(request: web.Request) -> web.Response:
        del request
        return web.json_response({"doors": [described(door) for door in doors()]})

    async def release(request: web.Request) -> web.Response:
        try:
            asked = msgspec.json.decode(await read_body(request), type=ReleaseRequest)
        except msgspec.DecodeError as exc:
            return error_response(400, f"expected {{\"request_id\": \"...\"}}: {exc}")
        released = [door.plan.name for door in doors() if door.release(asked.request_id)]
        if not released:
            return error_response(404, f"request_id {asked.request_id[:120]!r} is not "
                                       "quarantined by any door")
        return web.json_response({"released": asked.request_id, "doors": released})

    def hook(app: web.Application) -> None:
        app.router.add_get("/v1/doors", listing)
        app.router.add_post("/v1/doors/release", release)

    return hook
