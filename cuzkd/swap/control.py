"""``POST /v1/swap`` on the supervisor's control socket.

The answer streams newline-delimited JSON: one object per step (``installed``, ``activated``,
``restarting``, ``healthy``, ...) and a final ``{"event": "result", ...}``, so ``cuzkd swap``
can print progress per engine while a rolling restart that takes minutes is under way.
Everything that can be refused before a step is taken is answered with a plain 4xx JSON error
instead: a malformed request (400), a file that can't be a release (422), a swap already
running (409), the supervisor shutting down (503). A shutdown while a swap streams cancels it
(:meth:`~cuzkd.swap.rolling.SwapCoordinator.close`): the stream still ends with its result,
``cancelled``, at once.

``GET /v1/swap/history`` answers the release history (``cuzkd swap --history``): every record,
the active release and where ``--rollback`` would go; 503 when the store cannot be read.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from cuzkd.errors import ReleaseError, SwapInProgress
from cuzkd.httperrors import read_body
from cuzkd.states import OnInconclusive, SwapResult
from cuzkd.swap.analysis import Criteria
from cuzkd.swap.rolling import AnalysisPlan, SwapCoordinator, SwapOutcome
from cuzkd.units import parse_duration


class SwapRequest(msgspec.Struct, forbid_unknown_fields=True):
    path: str | None = None
    #: arguments for the smoke run of the new binary, as a shell-like string (``"--version"``)
    smoke: str | None = None
    #: how long the smoke run may take before its process group is killed (then refused)
    smoke_timeout: str | float = 30.0
    settle: str | float = 10.0
    rollback: bool = False
    #: canary analysis (``cuzkd swap --analysis``): absent, every engine moves at once
    analysis: str | float | None = None
    canary: int = 1
    min_throughput_ratio: float = 0.8
    min_partitions: int = 20
    max_failed_jobs: int = 0
    #: the operator's check, a shell-like string split with shlex and run without a shell
    check: str | None = None
    on_inconclusive: OnInconclusive = OnInconclusive.ROLLBACK


def analysis_plan(req: SwapRequest) -> AnalysisPlan | None:
    """The request's canary analysis; ValueError naming the bad field."""
    if req.analysis is None:
        return None
    seconds = parse_duration(req.analysis)
    if seconds <= 0:
        raise ValueError("analysis: must be longer than 0s")
    if req.canary < 1:
        raise ValueError("canary: at least 1 engine")
    if not 0 < req.min_throughput_ratio <= 10:
        raise ValueError("min_throughput_ratio: above 0 and at most 10")
    if req.min_partitions < 1 or req.max_failed_jobs < 0:
        raise ValueError("min_partitions: at least 1; max_failed_jobs: at least 0")
    check = shlex.split(req.check) if req.check is not None else None
    if check is not None and not check:
        raise ValueError("check: an empty command")
    return AnalysisPlan(seconds, req.canary, Criteria(req.min_throughput_ratio,
                                                      req.min_partitions, req.max_failed_jobs),
                        check, req.on_inconclusive)


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


def swap_routes(coordinator: SwapCoordinator) -> Callable[[web.Application], None]:
    """A control-app hook adding ``POST /v1/swap`` backed by ``coordinator``."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            req = msgspec.json.decode(await read_body(request), type=SwapRequest)
            settle = parse_duration(req.settle)
            smoke_timeout = parse_duration(req.smoke_timeout)
            smoke = shlex.split(req.smoke) if req.smoke is not None else None
            plan = analysis_plan(req)
        except (msgspec.DecodeError, ValueError) as exc:
            return _error(400, f"bad swap request: {exc}")
        if req.rollback == (req.path is not None):
            return _error(400, "bad swap request: give either `path` or `rollback: true`")
        if req.rollback and plan is not None:
            return _error(400, "bad swap request: `analysis` is for a swap, not a rollback")
        if coordinator.closed is not None:
            return _error(503, f"no swap now: {coordinator.closed}")
        if coordinator.busy:
            return _error(409, "swap in progress: wait for it to finish")
        if req.path is not None:
            try:
                coordinator.store.validate_source(Path(req.path))
            except ReleaseError as exc:
                outcome = coordinator.refuse(str(exc))
                return _error(422, str(exc), result=outcome.result)

        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        job = asyncio.create_task(
            _start(coordinator, req, smoke, smoke_timeout, settle, plan, events.put_nowait))
        job.add_done_callback(lambda _: events.put_nowait(None))
        client_gone = False
        while (event := await events.get()) is not None:
            client_gone = client_gone or not await _send(response, event)
        try:
            outcome = await job
        except SwapInProgress as exc:  # lost a race with another request since the check
            outcome = SwapOutcome(SwapResult.REFUSED, coordinator.active_release(), None, str(exc))
        if not client_gone and await _send(response, outcome.as_json()):
            await response.write_eof()
        return response

    async def history(request: web.Request) -> web.Response:
        del request
        try:
            return web.json_response(coordinator.history())
        except (ReleaseError, OSError) as exc:
            return _error(503, f"release history unavailable: {exc}")

    def add(app: web.Application) -> None:
        app.router.add_post("/v1/swap", handle)
        app.router.add_get("/v1/swap/history", history)

    return add


def _start(
    coordinator: SwapCoordinator,
    req: SwapRequest,
    smoke: list[str] | None,
    smoke_timeout: float,
    settle: float,
    plan: AnalysisPlan | None,
    progress: Callable[[dict[str, Any]], None],
) -> Coroutine[Any, Any, SwapOutcome]:
    if req.rollback:
        return coordinator.rollback(settle=settle, progress=progress)
    assert req.path is not None
    return coordinator.swap(Path(req.path), smoke_args=smoke, smoke_timeout=smoke_timeout,
                            settle=settle, progress=progress, plan=plan)


async def _send(response: web.StreamResponse, event: dict[str, Any]) -> bool:
    """Write one NDJSON line; False once the client has gone (the swap goes on regardless:
    stopping a rolling restart half-way would leave engines on mixed releases)."""
    try:
        await response.write(msgspec.json.encode(event) + b"\n")
    except (ConnectionResetError, RuntimeError):
        return False
    return True
