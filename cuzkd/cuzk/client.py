"""cuzkd's client of cuzk's gRPC ``GetStatus``: what the engine holds, kind by kind.

``/status`` lists only partitioned jobs (PoRep C2, SnapDeals) and only once dispatched; the
engine's scheduler queues and WindowPoSt/WinningPoSt proofs show only here, as per-kind
``pending`` and ``in_progress``. The cuzk drain waits for both to be empty
(:mod:`cuzkd.supervisor.core.drain`), and a stop counts what they still held as lost.

A read never raises into the supervisor: any failure (no listener yet, a timeout, a reply that
does not decode, an address grpc refuses) is a :class:`QueueReading` that says ``unknown`` and
why. A channel lives for one read: the stop sequence reads a few times a second at most, and a
restarted engine needs no reconnection logic. The real engine runs ``nvidia-smi`` for each
``GetStatus`` (tens of milliseconds of its CPU), which is why nothing polls it continuously.
"""

from __future__ import annotations

import grpc

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.cuzk.reading import KindQueue, QueueReading
from cuzkd.errortext import error_text
from cuzkd.kinds import reported_kind

GET_STATUS = "/cuzk.v1.ProvingEngine/GetStatus"
#: A GetStatus reply is a few hundred bytes per GPU worker; a larger one is not cuzk's.
MAX_REPLY_BYTES = 1 << 20


def reading_of(reply: pb.GetStatusResponse) -> QueueReading:
    """The reply in cuzkd's spelling: kinds normalised (entries of one kind summed)."""
    queues: dict[str, KindQueue] = {}
    for queue in reply.queues:
        label = reported_kind(queue.proof_kind)
        before = queues.get(label, KindQueue(0, 0))
        queues[label] = KindQueue(before.pending + queue.pending,
                                  before.in_progress + queue.in_progress)
    current = tuple(dict.fromkeys(g.current_job_id for g in reply.gpus if g.current_job_id))
    return QueueReading(queues, current, reply.total_proofs_completed,
                        reply.total_proofs_failed)


async def read_queues(address: str, timeout: float) -> QueueReading:
    """``GetStatus`` from the engine at ``address`` (``unix:///path`` or ``host:port``),
    answered within ``timeout`` seconds, or a reading that says why it is unknown."""
    options = [("grpc.max_receive_message_length", MAX_REPLY_BYTES),
               ("grpc.enable_retries", 0)]
    try:
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            call = channel.unary_unary(GET_STATUS,
                                       request_serializer=pb.GetStatusRequest.SerializeToString,
                                       response_deserializer=pb.GetStatusResponse.FromString)
            # grpc answers None (and logs) for a reply that does not decode
            reply: pb.GetStatusResponse | None = await call(pb.GetStatusRequest(),
                                                            timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return QueueReading.unknown(f"GetStatus {address}: {exc.code().name}: {exc.details()}")
    except Exception as exc:  # an address grpc refuses, a bug in a reply: unknown, not a crash
        return QueueReading.unknown(f"GetStatus {address}: {error_text(exc)}")
    if reply is None:
        return QueueReading.unknown(f"GetStatus {address}: the reply is not a GetStatusResponse")
    return reading_of(reply)
