"""The engine's HTTP API (aiohttp): cuzk's ``/status`` plus a small job API.

Every error is JSON ``{"error": "..."}`` with a 4xx/5xx status, including aiohttp's own 404,
405 and 413 (a middleware rewrites them), so clients never have to parse HTML. A bad request
only ever touches the request itself: validation happens before :meth:`Engine.submit` changes
anything.
"""

from __future__ import annotations

import errno
import math
import socket
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from cuzkd.bundled.jobs import Job, JobState
from cuzkd.bundled.pipeline import Engine
from cuzkd.errors import (
    EX_UNAVAILABLE,
    EX_USAGE,
    EngineDrainingError,
    JobRequestError,
    ListenError,
)
from cuzkd.httperrors import BODY_TIMEOUT, error_response, json_errors, read_body
from cuzkd.kinds import deprecation, normalise_kind
from cuzkd.status.document import encode_status
from cuzkd.units import ListenAddress, parse_listen
from cuzkd.unixsock import bind_private_socket

ENGINE_KEY = web.AppKey("engine", Engine)
BODY_TIMEOUT_KEY = web.AppKey("body_timeout", float)
#: Largest accepted request body; a job request is a few dozen bytes.
MAX_BODY_BYTES = 64 * 1024
#: Content types a job request may declare (none at all is taken as JSON too).
JSON_TYPES = ("application/json",)


class JobRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    proof_kind: str
    partitions: int | None = None
    size_log2: int | None = None


_REQUEST_DECODER = msgspec.json.Decoder(JobRequest)


class DrainRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    #: the drain's deadline; the engine's ``drain_timeout`` when absent
    timeout_secs: float | None = None


_DRAIN_DECODER = msgspec.json.Decoder(DrainRequest)
#: Longest drain a request may ask for (a day): a typo must not hold an engine for years.
MAX_DRAIN_SECS = 86400.0


async def _status(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    engine.refresh_status()
    body = encode_status(engine.tracker.snapshot())
    return web.Response(body=body, content_type="application/json")


async def _healthz(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response({"status": "ok" if engine.accepting else "draining"})


async def _submit(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if request.headers.get("Content-Type") is not None and request.content_type not in JSON_TYPES:
        return error_response(415, f"Content-Type {request.content_type!r}: send application/json")
    if not engine.accepting:
        return _draining_response(engine)
    try:
        body = _REQUEST_DECODER.decode(await read_body(request, request.app[BODY_TIMEOUT_KEY]))
    except msgspec.DecodeError as exc:
        return error_response(400, f"invalid job request: {exc}")
    try:
        job = engine.submit(normalise_kind(body.proof_kind), body.partitions, body.size_log2)
    except JobRequestError as exc:
        return error_response(400, str(exc))
    except EngineDrainingError:
        return _draining_response(engine)
    reply = {"job_id": job.job_id, "state": job.state, "proof_kind": job.proof_kind}
    if (warning := deprecation(body.proof_kind)) is not None:
        reply["deprecation"] = warning  # accepted all the same: a script written before
    return web.json_response(reply, status=202)


def _draining_response(engine: Engine) -> web.Response:
    """503 for a job offered while draining; ``Retry-After``: the seconds left of the drain
    (at least 1), after which this engine -- or its replacement -- accepts again."""
    response = error_response(503, "engine is draining and accepts no new jobs")
    remaining = engine.drain_remaining_secs() or 0.0
    response.headers["Retry-After"] = str(max(1, math.ceil(remaining)))
    return response


async def _drain(request: web.Request) -> web.Response:
    """``POST /v1/drain``: stop accepting, finish every accepted job, then exit 0."""
    engine = request.app[ENGINE_KEY]
    raw = await read_body(request, request.app[BODY_TIMEOUT_KEY])
    try:
        body = _DRAIN_DECODER.decode(raw) if raw.strip() else DrainRequest()
    except msgspec.DecodeError as exc:
        return error_response(400, f"invalid drain request: {exc}")
    timeout = engine.config.drain_timeout_secs if body.timeout_secs is None else body.timeout_secs
    if not 0 < timeout <= MAX_DRAIN_SECS:
        return error_response(400, f"timeout_secs must be above 0 and at most {MAX_DRAIN_SECS:g}")
    started = engine.begin_drain(timeout, "http")
    return web.json_response({"draining": True, "started": started,
                              "open_jobs": engine.open_jobs,
                              "remaining_secs": engine.drain_remaining_secs()}, status=202)


async def _job(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    job_id = request.match_info["job_id"]
    job = engine.jobs.get(job_id)
    if job is None:
        return error_response(404, f"unknown job {job_id!r}")
    return web.json_response(job_view(job, engine.now()))


def job_view(job: Job, now: float) -> dict[str, Any]:
    """The JSON of ``GET /v1/jobs/{id}``: state, timings, and proofs once done."""
    end = job.finished_at if job.finished_at is not None else now
    view: dict[str, Any] = {
        "job_id": job.job_id,
        "proof_kind": job.proof_kind,
        "state": job.state,
        "partitions": job.partitions,
        "size_log2": job.size_log2,
        "error": job.error,
        "timings": {
            "queued_secs": (job.started_at or end) - job.submitted_at,
            "wall_secs": end - job.submitted_at,
            "synth_secs": job.synth_secs,
            "gpu_secs": job.gpu_secs,
        },
    }
    if job.state == JobState.DONE:
        view["verified"] = all(job.verified)
        view["proofs"] = [msgspec.to_builtins(proof) for proof in job.proofs]
    return view


def build_app(engine: Engine, *, body_timeout: float = BODY_TIMEOUT) -> web.Application:
    """The engine's API; ``body_timeout``: how long a request body may take to arrive."""
    app = web.Application(middlewares=[json_errors], client_max_size=MAX_BODY_BYTES)
    app[ENGINE_KEY] = engine
    app[BODY_TIMEOUT_KEY] = body_timeout
    app.router.add_get("/status", _status)
    app.router.add_get("/healthz", _healthz)
    app.router.add_post("/v1/jobs", _submit)
    app.router.add_post("/v1/drain", _drain)
    app.router.add_get("/v1/jobs/{job_id}", _job)
    return app


#: bind() errors that mean the address is wrong rather than busy or forbidden.
_BAD_ADDRESS_ERRNOS = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EINVAL)


def check_listen(listen: str) -> ListenAddress:
    """The parsed ``--listen``; :class:`ListenError` (exit 64) when it is not an address."""
    try:
        return parse_listen(listen)
    except ValueError as exc:
        raise ListenError(f"--listen: {exc}", EX_USAGE) from None


async def start_site(runner: web.AppRunner, listen: str) -> str:
    """Bind ``HOST:PORT`` or ``unix:PATH`` and return the bound address (port 0 resolved).

    A stale socket file is removed first; the socket is 0600 before it listens
    (:func:`cuzkd.unixsock.bind_private_socket`). Every
    way of failing is one :class:`ListenError` naming the address and the problem.
    """
    address = check_listen(listen)
    site: web.BaseSite
    try:
        if address.is_unix:
            path = Path(address.path)
            site = web.SockSite(runner, bind_private_socket(path))
            await site.start()
            return f"unix:{path}"
        site = web.TCPSite(runner, address.host, address.port)
        await site.start()
    except socket.gaierror as exc:
        raise ListenError(f"--listen {listen}: host {address.host!r} does not resolve: "
                          f"{exc.strerror}", EX_USAGE) from None
    except OSError as exc:
        code = EX_USAGE if exc.errno in _BAD_ADDRESS_ERRNOS else EX_UNAVAILABLE
        raise ListenError(f"--listen {listen}: {exc.strerror or exc}", code) from None
    bound = runner.addresses[-1]
    return f"{bound[0]}:{bound[1]}"
