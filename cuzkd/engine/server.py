"""The engine's HTTP API (aiohttp): cuzk's ``/status`` plus a small job API.

Every error is JSON ``{"error": "..."}`` with a 4xx/5xx status, including aiohttp's own 404,
405 and 413 (a middleware rewrites them), so clients never have to parse HTML. A bad request
only ever touches the request itself: validation happens before :meth:`Engine.submit` changes
anything.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from cuzkd.engine.pipeline import Engine, EngineDrainingError, Job, JobRequestError
from cuzkd.status.document import encode_status

ENGINE_KEY = web.AppKey("engine", Engine)
#: Largest accepted request body; a job request is a few dozen bytes.
MAX_BODY_BYTES = 64 * 1024


class JobRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    proof_kind: str
    partitions: int | None = None
    size_log2: int | None = None


_REQUEST_DECODER = msgspec.json.Decoder(JobRequest)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _json_errors(request: web.Request,
                       handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                       ) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.reason)


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
    if not engine.accepting:
        return _error(503, "engine is shutting down and accepts no new jobs")
    try:
        body = _REQUEST_DECODER.decode(await request.read())
    except msgspec.DecodeError as exc:
        return _error(400, f"invalid job request: {exc}")
    try:
        job = engine.submit(body.proof_kind, body.partitions, body.size_log2)
    except JobRequestError as exc:
        return _error(400, str(exc))
    except EngineDrainingError as exc:
        return _error(503, str(exc))
    return web.json_response({"job_id": job.job_id, "state": job.state}, status=202)


async def _job(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    job_id = request.match_info["job_id"]
    job = engine.jobs.get(job_id)
    if job is None:
        return _error(404, f"unknown job {job_id!r}")
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
    if job.state == "done":
        view["verified"] = all(job.verified)
        view["proofs"] = [msgspec.to_builtins(proof) for proof in job.proofs]
    return view


def build_app(engine: Engine) -> web.Application:
    app = web.Application(middlewares=[_json_errors], client_max_size=MAX_BODY_BYTES)
    app[ENGINE_KEY] = engine
    app.router.add_get("/status", _status)
    app.router.add_get("/healthz", _healthz)
    app.router.add_post("/v1/jobs", _submit)
    app.router.add_get("/v1/jobs/{job_id}", _job)
    return app


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def remove_stale_socket(path: Path) -> None:
    """Remove a socket file left by a previous run; refuse to replace anything else."""
    if path.is_socket():
        path.unlink()
    elif path.exists():
        raise OSError(f"{path} exists and is not a socket; refusing to replace it")


async def start_site(runner: web.AppRunner, listen: str) -> str:
    """Bind ``HOST:PORT`` or ``unix:PATH`` and return the bound address (port 0 resolved).

    A stale socket file is removed first; the socket is created mode 0600 (umask while
    binding rather than chmod after, so it is never reachable by others even briefly).
    """
    site: web.BaseSite
    if listen.startswith("unix:"):
        path = Path(listen.removeprefix("unix:"))
        remove_stale_socket(path)
        site = web.UnixSite(runner, str(path))
        with _umask(0o177):  # bind creates the file 0777 & ~umask = 0600
            await site.start()
        return f"unix:{path}"
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT or unix:PATH")
    site = web.TCPSite(runner, host.strip("[]") or "127.0.0.1", int(port))
    await site.start()
    bound = runner.addresses[-1]
    return f"{bound[0]}:{bound[1]}"
