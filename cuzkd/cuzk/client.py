"""cuzkd's client of cuzk's gRPC: ``GetStatus`` for the drain, ``GetStatus`` and ``GetMetrics``
for the telemetry poll.

``/status`` lists only partitioned jobs (PoRep C2, SnapDeals) and only once dispatched; the
engine's scheduler queues and WindowPoSt/WinningPoSt proofs show only here, as per-kind
``pending`` and ``in_progress``. The cuzk drain waits for both to be empty
(:mod:`cuzkd.supervisor.core.drain`), and a stop counts what they still held as lost; the
telemetry poll (:mod:`cuzkd.supervisor.engines.telemetry`) exports them.

A read never raises into the supervisor: any failure (no listener yet, a timeout, a reset, a
reply that does not decode or is too large, an address grpc refuses) is a reading that says
why, with a bounded reason (:data:`cuzkd.cuzk.telemetry.FAILURE_REASONS`). One channel policy
for every read: a channel lives for one read (the drain reads a few times a second at most,
the telemetry every several seconds, and a restarted engine needs no reconnection logic), no
retries, replies over :data:`MAX_REPLY_BYTES` refused unread. The real engine runs
``nvidia-smi`` for each ``GetStatus`` (tens of milliseconds of its CPU), which is why nothing
polls it at the health loop's pace.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import grpc

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.cuzk.reading import KindQueue, QueueReading
from cuzkd.cuzk.telemetry import (
    BAD_METRICS_TEXT,
    CLIENT_ERROR,
    ERROR_STATUS,
    TIMEOUT,
    TOO_LARGE,
    UNAVAILABLE,
    UNDECODABLE,
    Failure,
    Outcomes,
    Telemetry,
    gpus_of,
    outcomes_of,
)
from cuzkd.errors import ReadFailed
from cuzkd.errortext import error_text
from cuzkd.kinds import reported_kind

SERVICE = "/cuzk.v1.ProvingEngine/"
#: A GetStatus reply is a few hundred bytes per GPU worker, a GetMetrics text a few kB; a
#: larger one is not cuzk's.
MAX_REPLY_BYTES = 1 << 20
_OPTIONS = [("grpc.max_receive_message_length", MAX_REPLY_BYTES), ("grpc.enable_retries", 0)]

R = TypeVar("R")

#: The reason of a gRPC status code (any other: :data:`ERROR_STATUS`).
_REASONS = {grpc.StatusCode.UNAVAILABLE: UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED: TIMEOUT,
            grpc.StatusCode.RESOURCE_EXHAUSTED: TOO_LARGE}


def reading_of(reply: pb.GetStatusResponse) -> QueueReading:
    """The reply in cuzkd's spelling: kinds normalised (entries of one kind summed)."""
    current = tuple(dict.fromkeys(g.current_job_id for g in reply.gpus if g.current_job_id))
    return QueueReading(queues_of(reply), current, reply.total_proofs_completed,
                        reply.total_proofs_failed)


def queues_of(reply: pb.GetStatusResponse) -> dict[str, KindQueue]:
    """The per-kind queues, kinds normalised (entries of one kind summed)."""
    queues: dict[str, KindQueue] = {}
    for queue in reply.queues:
        label = reported_kind(queue.proof_kind)
        before = queues.get(label, KindQueue(0, 0))
        queues[label] = KindQueue(before.pending + queue.pending,
                                  before.in_progress + queue.in_progress)
    return queues


@asynccontextmanager
async def _channel(address: str) -> AsyncIterator[grpc.aio.Channel]:
    """A channel for one read; an address grpc refuses is a :class:`ReadFailed`."""
    try:
        channel = grpc.aio.insecure_channel(address, options=_OPTIONS)
    except Exception as exc:
        raise ReadFailed(CLIENT_ERROR, f"{address}: {error_text(exc)}") from exc
    async with channel:
        yield channel


async def _call(channel: grpc.aio.Channel, address: str, method: str,
                request: pb.GetStatusRequest | pb.GetMetricsRequest,
                decode: Callable[[bytes], R], timeout: float) -> R:
    """One unary call; any failure is a :class:`ReadFailed` naming method and address."""
    where = f"{method} {address}"
    call = channel.unary_unary(SERVICE + method, request_serializer=type(request).SerializeToString,
                               response_deserializer=decode)
    try:
        # grpc answers None (and logs) for a reply that does not decode
        reply: R | None = await call(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        raise ReadFailed(_REASONS.get(code, ERROR_STATUS),
                         f"{where}: {code.name}: {exc.details()}") from exc
    except Exception as exc:  # a bug in a reply, a channel grpc gave up on: told, not a crash
        raise ReadFailed(CLIENT_ERROR, f"{where}: {error_text(exc)}") from exc
    if reply is None:
        raise ReadFailed(UNDECODABLE, f"{where}: the reply does not decode")
    return reply


async def read_queues(address: str, timeout: float) -> QueueReading:
    """``GetStatus`` from the engine at ``address`` (``unix:///path`` or ``host:port``),
    answered within ``timeout`` seconds, or a reading that says why it is unknown."""
    try:
        async with _channel(address) as channel:
            reply = await _call(channel, address, "GetStatus", pb.GetStatusRequest(),
                                pb.GetStatusResponse.FromString, timeout)
    except ReadFailed as exc:
        return QueueReading.unknown(str(exc))
    return reading_of(reply)


async def read_telemetry(address: str, timeout: float) -> Telemetry:
    """``GetStatus`` then ``GetMetrics`` over one channel, each within ``timeout`` seconds.
    A ``GetStatus`` that fails ends the read (the engine's gRPC told nothing: one failure,
    not a second wait for ``GetMetrics``); a ``GetMetrics`` that fails, or whose text is not
    exposition, costs only the outcomes."""
    failures: list[Failure] = []
    status: pb.GetStatusResponse | None = None
    outcomes: Outcomes | None = None
    try:
        async with _channel(address) as channel:
            status = await _call(channel, address, "GetStatus", pb.GetStatusRequest(),
                                 pb.GetStatusResponse.FromString, timeout)
            metrics = await _call(channel, address, "GetMetrics", pb.GetMetricsRequest(),
                                  pb.GetMetricsResponse.FromString, timeout)
            try:
                outcomes = outcomes_of(metrics.prometheus_text)
            except ValueError as exc:
                failures.append(Failure(BAD_METRICS_TEXT,
                                        f"GetMetrics {address}: {error_text(exc)}"))
    except ReadFailed as exc:
        failures.append(Failure(exc.reason, str(exc)))
    if status is None:
        return Telemetry(failures=tuple(failures))
    gpus = gpus_of([(g.ordinal, g.name, g.vram_total_bytes, g.vram_free_bytes,
                     g.current_proof_kind) for g in status.gpus])
    return Telemetry(queues_of(status), gpus, outcomes, tuple(failures))
