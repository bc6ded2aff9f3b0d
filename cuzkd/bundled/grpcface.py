"""cuzk's gRPC service, ``cuzk.v1.ProvingEngine``, served by the bundled engine beside its HTTP
API (``cuzkd engine --grpc-listen``), so a door, the demo and every test can talk to the bundled
engine as Curio talks to cuzk, without cuzk and without a GPU.

:class:`ProvingFace` answers each call through the same :class:`~cuzkd.bundled.pipeline.Engine`
as ``POST /v1/jobs``, as cuzk answers it where cuzk's behaviour is known, and better behaved
where cuzk's is a hazard. Each method's answer is the table in docs/engine.md, *cuzk's gRPC
(`--grpc-listen`)*.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import grpc
import msgspec
from google.protobuf.message import DecodeError, Message
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cuzkd.bundled.jobs import Job, JobState
from cuzkd.bundled.pipeline import Engine
from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.errors import EX_UNAVAILABLE, EX_USAGE, EngineDrainingError, GrpcError, ListenError
from cuzkd.kinds import ProofKind
from cuzkd.priority import Priority
from cuzkd.units import ListenAddress, parse_listen
from cuzkd.unixsock import remove_stale_socket

SERVICE = "cuzk.v1.ProvingEngine"
#: cuzk's limit, each way: a PoRep C1 output is about 51 MB.
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
#: Longest ``request_id`` accepted: Curio's are under a hundred characters; a megabyte of id
#: would be kept in the engine's job table (and logged) for every retained job.
MAX_REQUEST_ID_CHARS = 1024
#: cuzk's enum -> its /status name (the one vocabulary, cuzkd/kinds.py).
KINDS: Mapping[int, ProofKind] = {
    pb.POREP_SEAL_COMMIT: ProofKind.POREP_C2,
    pb.SNAP_DEALS_UPDATE: ProofKind.SNAP_UPDATE,
    pb.WINDOW_POST_PARTITION: ProofKind.WINDOW_POST,
    pb.WINNING_POST: ProofKind.WINNING_POST,
}

#: cuzk's enum -> the pipeline's priority (unspecified: NORMAL, as an HTTP job's).
PRIORITIES: Mapping[int, Priority] = {
    **{priority.value: priority for priority in Priority},
    Priority.PRIORITY_UNSPECIFIED.value: Priority.NORMAL,
}

M = TypeVar("M", bound=Message)


# Requests and replies pass grpc as bytes, with no (de)serializer: a request that does not decode
# is this module's to refuse with a status, not grpc's to log as an internal error.
def decode(message: type[M], raw: bytes) -> M:
    try:
        return message.FromString(raw)
    except DecodeError as exc:
        raise GrpcError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"not a {message.DESCRIPTOR.name}: {exc}") from None


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def result_of(job: Job) -> pb.AwaitProofResponse:
    """A finished job as cuzk's reply: status, the proof (its partitions' proofs as JSON) or
    the error, and the measured timings."""
    assert job.finished_at is not None
    started = job.started_at if job.started_at is not None else job.finished_at
    reply = pb.AwaitProofResponse(
        job_id=job.request_id, queue_wait_ms=_ms(started - job.submitted_at), srs_load_ms=0,
        synthesis_ms=_ms(job.synth_span.seconds), gpu_compute_ms=_ms(job.gpu_span.seconds),
        total_ms=_ms(job.finished_at - job.submitted_at))
    if job.state == JobState.DONE:
        reply.status = pb.AwaitProofResponse.COMPLETED
        reply.proof = msgspec.json.encode(job.proofs)
    else:
        reply.status = pb.AwaitProofResponse.FAILED
        reply.error_message = job.error or "failed"
    return reply


def queues_of(engine: Engine) -> dict[ProofKind, tuple[int, int]]:
    """Every kind -> (jobs queued, jobs proving) among the engine's open jobs."""
    queues = dict.fromkeys(ProofKind, (0, 0))
    for job in engine.jobs.values():
        if job.finished_at is not None or job.proof_kind not in queues:
            continue
        kind = ProofKind(job.proof_kind)
        pending, in_progress = queues[kind]
        queues[kind] = (pending + 1, in_progress) if job.state == JobState.QUEUED else (
            pending, in_progress + 1)
    return queues


class _CuzkFamilies(Collector):
    """``GetMetrics``' text: the families cuzk's ``GetMetrics`` has, from one snapshot."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        snapshot = engine.tracker.snapshot()
        completed = CounterMetricFamily("cuzk_proofs_completed", "Proofs completed, by kind.",
                                        labels=["proof_kind"])
        failed = CounterMetricFamily("cuzk_proofs_failed", "Proofs failed, by kind.",
                                     labels=["proof_kind"])
        for kind in ProofKind:
            label = kind.replace("-", "_")  # cuzk's gRPC spelling
            completed.add_metric([label], snapshot.counters.completed_by_kind.get(kind) or 0)
            failed.add_metric([label], snapshot.counters.failed_by_kind.get(kind) or 0)
        queues = queues_of(engine).values()
        yield completed
        yield failed
        yield GaugeMetricFamily("cuzk_uptime_seconds", "Seconds since the engine started.",
                                value=snapshot.uptime_secs or 0)
        yield GaugeMetricFamily("cuzk_queue_depth", "Proofs accepted and not started.",
                                value=sum(pending for pending, _ in queues))
        yield GaugeMetricFamily("cuzk_running_jobs", "Proofs being proved.",
                                value=sum(running for _, running in queues))
        yield GaugeMetricFamily("cuzk_gpu_workers", "GPU workers.", value=len(engine.workers))


class ProvingFace:
    """The servicer: one method per RPC, each bytes in, bytes out (see :func:`handlers`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._metrics = CollectorRegistry(auto_describe=False)
        self._metrics.register(_CuzkFamilies(engine))

    def submit(self, request: pb.SubmitProofRequest) -> Job:
        """The job ``request`` asks for: the open one under its id, else a new one."""
        kind = KINDS.get(request.proof_kind)
        if kind is None:
            raise GrpcError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"proof_kind {request.proof_kind}: not one of {sorted(KINDS)}")
        if request.priority not in PRIORITIES:
            raise GrpcError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"priority {request.priority}: not one of {sorted(PRIORITIES)}")
        if len(request.request_id) > MAX_REQUEST_ID_CHARS:
            raise GrpcError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"request_id is {len(request.request_id)} characters; at most "
                          f"{MAX_REQUEST_ID_CHARS}")
        open_job = self.engine.requests.get(request.request_id) if request.request_id else None
        if open_job is not None and open_job.finished_at is None:
            if open_job.proof_kind != kind:
                raise GrpcError(grpc.StatusCode.ALREADY_EXISTS,
                              f"request {request.request_id!r} is a {open_job.proof_kind} "
                              "proof still open")
            return open_job
        try:
            return self.engine.submit(kind, request_id=request.request_id,
                                      priority=PRIORITIES[request.priority])
        except EngineDrainingError as exc:
            raise GrpcError(grpc.StatusCode.UNAVAILABLE, str(exc)) from None

    async def prove(self, raw: bytes) -> pb.ProveResponse:
        job = self.submit(decode(pb.ProveRequest, raw).submit)
        await job.finished.wait()
        return pb.ProveResponse(result=result_of(job))

    async def submit_proof(self, raw: bytes) -> pb.SubmitProofResponse:
        job = self.submit(decode(pb.SubmitProofRequest, raw))
        place = (-job.priority, job.submitted_at)  # the scheduler's order
        ahead = sum(1 for other in self.engine.jobs.values()
                    if other.state == JobState.QUEUED
                    and (-other.priority, other.submitted_at) < place)
        return pb.SubmitProofResponse(job_id=job.request_id,
                                      queue_position=ahead if job.state == JobState.QUEUED else 0)

    async def await_proof(self, raw: bytes) -> pb.AwaitProofResponse:
        job_id = decode(pb.AwaitProofRequest, raw).job_id
        job = self.engine.requests.get(job_id)
        if job is None:
            raise GrpcError(grpc.StatusCode.NOT_FOUND, f"no job {job_id[:200]!r}")
        await job.finished.wait()
        return result_of(job)

    async def cancel_proof(self, raw: bytes) -> pb.CancelProofResponse:
        decode(pb.CancelProofRequest, raw)
        return pb.CancelProofResponse(was_running=False)

    async def preload_srs(self, raw: bytes) -> pb.PreloadSrsResponse:
        decode(pb.PreloadSrsRequest, raw)
        return pb.PreloadSrsResponse(already_loaded=True, load_time_ms=0)

    async def evict_srs(self, raw: bytes) -> pb.EvictSrsResponse:
        decode(pb.EvictSrsRequest, raw)
        return pb.EvictSrsResponse(was_loaded=False, freed_bytes=0)

    async def get_status(self, raw: bytes) -> pb.GetStatusResponse:
        decode(pb.GetStatusRequest, raw)
        engine = self.engine
        engine.refresh_status()
        snapshot = engine.tracker.snapshot()
        names = dict(engine.backend.devices)
        extensions = snapshot.cuzkd_extensions
        memory = {d.gpu_ordinal: d for d in (extensions.gpu_devices if extensions else [])}
        reply = pb.GetStatusResponse(
            total_proofs_completed=snapshot.counters.total_completed or 0,
            total_proofs_failed=snapshot.counters.total_failed or 0,
            uptime_seconds=int(snapshot.uptime_secs or 0))
        for worker in snapshot.gpu_workers:
            device = memory.get(worker.gpu_ordinal)
            job = engine.jobs.get(worker.current_job or "")
            reply.gpus.add(
                ordinal=worker.gpu_ordinal, name=names.get(worker.gpu_ordinal, ""),
                vram_total_bytes=device.total_bytes if device else 0,
                vram_free_bytes=device.total_bytes - device.used_bytes if device else 0,
                current_job_id=job.request_id if job else "",
                current_proof_kind=job.proof_kind if job else "")
        for srs in snapshot.allocations.srs:
            reply.loaded_srs.add(circuit_id=srs.circuit_id, tier=pb.SRSStatus.HOT,
                                 size_bytes=srs.bytes)
        for kind, (pending, in_progress) in queues_of(engine).items():
            reply.queues.add(proof_kind=kind, pending=pending, in_progress=in_progress)
        return reply

    async def get_metrics(self, raw: bytes) -> pb.GetMetricsResponse:
        decode(pb.GetMetricsRequest, raw)
        return pb.GetMetricsResponse(prometheus_text=generate_latest(self._metrics).decode())


def _method(call: Callable[[bytes], Awaitable[Message]]) -> grpc.RpcMethodHandler[bytes, bytes]:
    async def handle(raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        try:
            reply = await call(raw)
        except GrpcError as exc:
            await context.abort(exc.code, str(exc))
        return reply.SerializeToString()
    return grpc.unary_unary_rpc_method_handler(handle)


def handlers(face: ProvingFace) -> grpc.GenericRpcHandler:
    """Every method of ``cuzk.v1.ProvingEngine`` on ``face``."""
    return grpc.method_handlers_generic_handler(SERVICE, {
        "Prove": _method(face.prove), "SubmitProof": _method(face.submit_proof),
        "AwaitProof": _method(face.await_proof), "CancelProof": _method(face.cancel_proof),
        "GetStatus": _method(face.get_status), "GetMetrics": _method(face.get_metrics),
        "PreloadSRS": _method(face.preload_srs), "EvictSRS": _method(face.evict_srs),
    })


def check_grpc_listen(listen: str, http: ListenAddress | None = None) -> Path | None:
    """``--grpc-listen``'s socket path (``unix:///ABSOLUTE/PATH``, as cuzk writes it), or
    None for ``HOST:PORT``; :class:`ListenError` (exit 64) for anything else, or for the socket
    ``http`` (the ``--listen`` address) names: binding it would replace the HTTP API's."""
    try:
        if listen.startswith("unix:"):
            path = listen.removeprefix("unix://")
            if not listen.startswith("unix://") or not path.startswith("/"):
                raise ValueError(f"{listen!r}: write unix:///ABSOLUTE/PATH")
            socket = Path(parse_listen(f"unix:{path}").path)
            if http is not None and http.is_unix and Path(http.path).resolve() == socket.resolve():
                raise ValueError(f"{listen!r} is the --listen socket: name another")
            return socket
        parse_listen(listen, allow_unix=False)
    except ValueError as exc:
        raise ListenError(f"--grpc-listen: {exc}", EX_USAGE) from None
    return None


async def start_grpc(engine: Engine, listen: str) -> tuple[grpc.aio.Server, str]:
    """Serve ``engine`` over cuzk's gRPC at ``listen``; returns the server and the bound
    address (port 0 resolved). A Unix socket is 0600 before it listens (the supervisor, its
    only client, runs as the engine's user), a stale socket file is replaced; a TCP port in
    use is refused (:class:`ListenError`, exit 69), never shared."""
    path = check_grpc_listen(listen)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                      ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                      # grpc's default would let a second engine bind the
                                      # same port and take half of the calls, silently
                                      ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handlers(ProvingFace(engine)),))
    if path is not None:
        try:
            remove_stale_socket(path)
        except OSError as exc:
            raise ListenError(f"--grpc-listen {listen}: {exc.strerror or exc}",
                              EX_UNAVAILABLE) from None
    try:
        port = server.add_insecure_port(listen)  # binds; nothing listens before start()
    except RuntimeError as exc:
        raise ListenError(f"--grpc-listen {listen}: cannot bind: {exc}", EX_UNAVAILABLE) from None
    if path is not None:
        path.chmod(0o600)  # bind created it (never follows a symlink): ours to chmod
        address = listen
    else:
        address = f"{listen.rpartition(':')[0]}:{port}"
    await server.start()
    return server, address

