"""What the door reads of a request before relaying its bytes unchanged.

The door decides where a call goes from three facts -- its method, its priority and the job it
names (a ``Prove``'s or ``SubmitProof``'s ``request_id``, which cuzk makes the job id; an
``AwaitProof``'s ``job_id``) -- so it reads the request once for them (a ``Prove`` on the
wire) and refuses bytes that are no ``cuzk.v1`` message at all with a clear
``INVALID_ARGUMENT``, instead of passing them to the engine. What it sends on is the
caller's bytes, never a re-encoding.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError, Message

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.cuzk.wire import read_call as read_prove
from cuzkd.cuzk.wire import read_submit
from cuzkd.errors import BadRequest, RequestIdTooLong
from cuzkd.kinds import ENUM_KINDS
from cuzkd.supervisor.core.doorbook import Call

SERVICE = "cuzk.v1.ProvingEngine"
#: method name -> its request message: every method cuzk serves
REQUESTS: dict[str, type[Message]] = {
    "SubmitProof": pb.SubmitProofRequest, "AwaitProof": pb.AwaitProofRequest,
    "Prove": pb.ProveRequest, "CancelProof": pb.CancelProofRequest,
    "GetStatus": pb.GetStatusRequest, "GetMetrics": pb.GetMetricsRequest,
    "PreloadSRS": pb.PreloadSrsRequest, "EvictSRS": pb.EvictSrsRequest,
}


#: method name -> its reply message: what an engine's answer must decode as
REPLIES: dict[str, type[Message]] = {
    "SubmitProof": pb.SubmitProofResponse, "AwaitProof": pb.AwaitProofResponse,
    "Prove": pb.ProveResponse, "CancelProof": pb.CancelProofResponse,
    "GetStatus": pb.GetStatusResponse, "GetMetrics": pb.GetMetricsResponse,
    "PreloadSRS": pb.PreloadSrsResponse, "EvictSRS": pb.EvictSrsResponse,
}


#: The longest ``request_id`` (or ``job_id``) a call may name, in bytes: cuzk's are well under
#: 256 (``wdpost-<miner>-[<partition> ...]`` the longest), and cuzk puts each in its ``/status``,
#: where ids of megabytes would grow the document past what cuzkd reads.
MAX_REQUEST_ID_BYTES = 1024


def method_name(path: str) -> str | None:
    """``Prove`` for ``/cuzk.v1.ProvingEngine/Prove``; None for a method cuzk does not serve."""
    service, _, name = path.removeprefix("/").partition("/")
    return name if service == SERVICE and name in REQUESTS else None


def read_call(call_id: int, method: str, request: bytes, timeout: float | None) -> Call:
    """Call ``call_id`` as the book sees it, read from ``request`` (bytes of ``method``'s
    request; ``timeout``: what its caller's gRPC deadline leaves); BadRequest if they do not
    decode as that message, or name a ``request_id`` longer than :data:`MAX_REQUEST_ID_BYTES`.
    A ``Prove`` and a ``SubmitProof`` are walked on the wire, never copied (their payload is
    tens of MB); the small requests are parsed."""
    if method in ("Prove", "SubmitProof"):
        submit = read_prove(request) if method == "Prove" else read_submit(request)
        if submit is None:
            raise BadRequest(f"the request is not a {REQUESTS[method].DESCRIPTOR.full_name}")
        id_bytes = len(submit.request_id.encode())
        if id_bytes > MAX_REQUEST_ID_BYTES:
            raise RequestIdTooLong(f"its request_id is {id_bytes} bytes long, over"
                                   f" {MAX_REQUEST_ID_BYTES} (cuzk's ids are well under 256)")
        return Call(call_id, method, len(request), submit.priority, submit.request_id,
                    _kind(submit.proof_kind), timeout, request)
    message = REQUESTS[method]()
    try:
        message.ParseFromString(request)
    except DecodeError as exc:
        raise BadRequest(f"the request is not a {message.DESCRIPTOR.full_name}: {exc}") from None
    if isinstance(message, pb.AwaitProofRequest | pb.CancelProofRequest):
        if len(message.job_id.encode()) > MAX_REQUEST_ID_BYTES:
            raise RequestIdTooLong(f"its job_id is over {MAX_REQUEST_ID_BYTES} bytes long")
        return Call(call_id, method, len(request), job=message.job_id, timeout=timeout)
    return Call(call_id, method, len(request), timeout=timeout)


def _kind(number: int) -> str:
    """cuzk's name of a ``ProofKind`` number ("" for none of cuzk's: no deadline, no PoSt)."""
    kind = ENUM_KINDS.get(number)
    return "" if kind is None else str(kind)


def broken_reply(method: str, reply: bytes) -> str | None:
    """Why ``reply`` cannot be ``method``'s answer (it does not decode as its message), or None.

    An engine answering such bytes is broken, not its caller's request: the door retries the
    call elsewhere and has the engine restarted instead of handing Curio garbage. A reply is a
    proof and a few numbers (kB), a GetMetrics text tens of kB: decoding it costs microseconds.
    """
    try:
        REPLIES[method].FromString(reply)
    except DecodeError as exc:
        return f"{method}'s reply is not a {REPLIES[method].DESCRIPTOR.full_name}: {exc}"
    return None


def submitted_job(reply: bytes) -> str:
    """The ``job_id`` of a SubmitProof's reply ("" when it does not decode: the engine's
    reply is relayed as it is, the book only learns no job)."""
    message = pb.SubmitProofResponse()
    try:
        message.ParseFromString(reply)
    except DecodeError:
        return ""
    return message.job_id
