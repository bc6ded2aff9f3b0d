"""The telemetry poll of a cuzk engine's gRPC: what a failing address costs (its series, a
counted reason, one log line per reason per 10 s) once its start is over, and that the next
answer brings them back."""

from __future__ import annotations

from pathlib import Path

import structlog
from structlog.typing import FilteringBoundLogger
from support.cuzk_grpc import serve

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.supervisor.engines.telemetry import GrpcTelemetry


async def test_failures_drop_the_answer_count_their_reason_and_log_once(tmp_path: Path) -> None:
    address = f"unix://{tmp_path}/cuzk.sock"
    log: FilteringBoundLogger = structlog.get_logger("test").bind(engine="c0")
    now = [0.0]
    telemetry = GrpcTelemetry(address, timeout=2, interval=10, start_grace=30,
                              clock=lambda: now[0], log=log, limited=LimitedLog())
    with structlog.testing.capture_logs() as logs:
        await telemetry.poll()  # nothing listens yet: the engine's start (cuzk binds it last)
        assert telemetry.errors_total == {} and not logs
        now[0] = 30.0
        await telemetry.poll()
        await telemetry.poll()
    assert telemetry.latest is None
    assert telemetry.errors_total == {"unavailable": 2}
    [line] = [e for e in logs if e["event"] == "engine_grpc_telemetry_failed"]
    assert line["reason"] == "unavailable" and address in line["error"]

    async def status(request: pb.GetStatusRequest, context: object) -> pb.GetStatusResponse:
        reply = pb.GetStatusResponse()
        reply.queues.add(proof_kind="winning_post", pending=1)
        return reply

    server, _ = await serve(tmp_path, status)
    try:
        await telemetry.poll()  # GetStatus answers; GetMetrics is not implemented
    finally:
        await server.stop(None)
    assert telemetry.latest is not None and telemetry.latest.queues is not None
    assert telemetry.latest.queues["winning-post"].pending == 1
    assert telemetry.errors_total == {"unavailable": 2, "error_status": 1}
    await telemetry.poll()
    assert telemetry.latest is None  # the engine's gRPC went: so do its series
