"""The doors on the supervisor's control socket: ``GET /v1/doors`` (the door process -- pid,
memory, restarts, exits, bounds hit -- and each door, its engines, its held calls and the
request ids it has quarantined) and ``POST /v1/doors/release`` (``{"request_id": "..."}``: end
a quarantine, as ``cuzkd door release ID`` does).

A quarantined id is a request that crashed an engine twice, the second time with no other
suspect beside it (docs/door.md): the door refuses it ``FAILED_PRECONDITION`` until its
``[door] quarantine`` ends. An operator who has fixed the engine, or believes the crashes were
chance, releases it here. Request ids are the caller's text (brackets and spaces in
WindowPoSt ids), so the id travels in a JSON body, never in the path. The doors' state is the
door process's: while none serves (it is being started again) the answer is 503.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from cuzkd.errors import ChannelClosed
from cuzkd.httperrors import error_response, read_body
from cuzkd.supervisor.door.doors import Doors


class ReleaseRequest(msgspec.Struct, forbid_unknown_fields=True):
    request_id: str


def door_routes(doors: Doors) -> Callable[[web.Application], None]:
    """The routes' hook."""

    def described(door: dict[str, Any]) -> dict[str, Any]:
        wall = time.time()
        return {**door, "quarantined": [
            {"request_id": q["request_id"], "engine": q["engine"],
             "since": wall - q["since_seconds_ago"], "until": wall + q["seconds_left"]}
            for q in door["quarantined"]]}

    async def listing(request: web.Request) -> web.Response:
        del request
        if not doors.planned:
            return web.json_response({"process": None, "doors": []})
        try:
            answer = await doors.ask("doors")
        except ChannelClosed as exc:
            return error_response(503, f"the door process cannot answer: {exc}")
        return web.json_response({"process": doors.process_info(),
                                  "doors": [described(door) for door in answer]})

    async def release(request: web.Request) -> web.Response:
        try:
            asked = msgspec.json.decode(await read_body(request), type=ReleaseRequest)
        except msgspec.DecodeError as exc:
            return error_response(400, f"expected {{\"request_id\": \"...\"}}: {exc}")
        try:
            released = await doors.ask("release", asked.request_id)
        except ChannelClosed as exc:
            return error_response(503, f"the door process cannot answer: {exc}")
        if not released:
            return error_response(404, f"request_id {asked.request_id[:120]!r} is not "
                                       "quarantined by any door")
        return web.json_response({"released": asked.request_id, "doors": released})

    def hook(app: web.Application) -> None:
        app.router.add_get("/v1/doors", listing)
        app.router.add_post("/v1/doors/release", release)

    return hook
