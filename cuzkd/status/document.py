"""The typed ``/status`` document: cuzk's fields exactly, plus cuzkd's optional extensions.

These structs are the single definition of the document. The reference engine encodes them,
the supervisor and the exporter decode them -- from our engine and from a real cuzk daemon
alike. Every field of cuzk's document is required (a document missing one is a wrong schema,
not a partial one); unknown fields are ignored so a newer cuzk stays readable. The extensions
live under one key, ``cuzkd_extensions``, which a real cuzk never sends.

See ``tests/fixtures/cuzk-status.md`` (a copy of cuzk's description) for cuzk's field list
and ``docs/status.md`` for the extensions.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

#: cuzk's unsigned integers. The upper bound matters: JSON integers decode to arbitrary-precision
#: Python ints, and one too large for a float (10**400) would make the exporter's ``float()``
#: raise and fail the whole scrape; such a document is malformed instead (msgspec bounds stop at
#: int64, far above any real count or byte size).
NonNegInt = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]

#: cuzk's proof kinds and the partitions each job of the kind has. Shared by the engine (which
#: splits jobs), ``cuzkd bench`` (its ``--kind`` choices) and the demo load.
PARTITIONS: dict[str, int] = {"porep": 10, "snap": 16, "wpost": 1, "winning": 1}

# Every struct below is ``gc=False``: a document is a tree (frozen, never referring back to
# itself), so the cycle collector need not track its thousands of partitions -- tracking them
# doubled the cost of decoding a busy engine's 1 MB document.

PartitionState = Literal["pending", "synthesizing", "synth_done", "gpu", "done", "failed"]
WorkerState = Literal["idle", "proving"]

#: Partition phases in pipeline order (``failed`` can follow any of them).
PARTITION_STATES: tuple[PartitionState, ...] = (
    "pending",
    "synthesizing",
    "synth_done",
    "gpu",
    "done",
    "failed",
)

#: The phases whose entries are counted cumulatively (``pending`` is where partitions start).
COUNTED_PHASES: tuple[PartitionState, ...] = ("synthesizing", "synth_done", "gpu", "done", "failed")

#: Upper bounds (seconds) of the fixed phase-duration histogram buckets. From a few
#: milliseconds (small reference-engine partitions) to minutes (32 GiB PoRep synthesis).
DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
)

#: Upper bounds (seconds) of the end-to-end job-latency histogram: from a WinningPoSt (seconds;
#: its chain deadline is about 20 s) to a 32 GiB PoRep or a late WindowPoSt (tens of minutes;
#: a WindowPoSt deadline window is 30 minutes).
JOB_DURATION_BUCKETS: tuple[float, ...] = (
    1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
    900.0, 1200.0, 1800.0, 2700.0, 3600.0,
)


class Memory(msgspec.Struct, frozen=True, gc=False):
    total_bytes: NonNegInt
    used_bytes: NonNegInt
    available_bytes: NonNegInt


class Synthesis(msgspec.Struct, frozen=True, gc=False):
    max_concurrent: NonNegInt
    active: NonNegInt


class Partition(msgspec.Struct, frozen=True, gc=False):
    index: NonNegInt
    state: PartitionState
    synth_ms: NonNegInt | None
    gpu_ms: NonNegInt | None


class Pipeline(msgspec.Struct, frozen=True, gc=False):
    job_id: str
    proof_kind: str
    started_secs_ago: NonNegFloat
    total_partitions: NonNegInt
    partitions_done: NonNegInt
    partitions: list[Partition]


class GpuWorker(msgspec.Struct, frozen=True, gc=False):
    worker_id: NonNegInt
    gpu_ordinal: NonNegInt
    state: WorkerState
    current_job: str | None
    current_partition: NonNegInt | None
    busy_secs: NonNegFloat | None


class Allocation(msgspec.Struct, frozen=True, gc=False):
    circuit_id: str
    bytes: NonNegInt
    last_used_secs_ago: NonNegFloat
    evictable: bool


class Allocations(msgspec.Struct, frozen=True, gc=False):
    srs: list[Allocation]
    pce: list[Allocation]


class Counters(msgspec.Struct, frozen=True, gc=False):
    total_completed: NonNegInt
    total_failed: NonNegInt
    completed_by_kind: dict[str, NonNegInt]
    failed_by_kind: dict[str, NonNegInt]
    queue_depth: NonNegInt


class Buffers(msgspec.Struct, frozen=True, gc=False):
    synth_in_flight: NonNegInt
    provers_in_flight: NonNegInt
    aux_in_flight: NonNegInt
    shells_in_flight: NonNegInt
    pending_handles: NonNegInt


# --- cuzkd extensions -------------------------------------------------------------------------


class Histogram(msgspec.Struct, frozen=True, gc=False):
    """A fixed-bucket histogram: ``bucket_counts[i]`` observations were ``<= bounds[i]``
    (cumulative, like Prometheus ``le`` buckets); ``count`` includes the ``+Inf`` bucket."""

    bounds: list[float]
    bucket_counts: list[NonNegInt]
    count: NonNegInt
    sum: NonNegFloat


class WorkerBusyTotal(msgspec.Struct, frozen=True, gc=False):
    worker_id: NonNegInt
    gpu_ordinal: NonNegInt
    busy_seconds_total: NonNegFloat


class GpuDevice(msgspec.Struct, frozen=True, gc=False):
    """One device as the engine sees it. ``total_bytes``/``used_bytes`` come from the driver
    (CuPy ``memGetInfo``), ``pool_bytes`` from the engine's allocator pool; the CPU
    pseudo-device reports zeros."""

    gpu_ordinal: NonNegInt
    name: str
    used_bytes: NonNegInt
    total_bytes: NonNegInt
    pool_bytes: NonNegInt
    #: NVML-style UUID ("GPU-..."), "" when unknown (CPU, older engines)
    uuid: str = ""


class Extensions(msgspec.Struct, frozen=True, gc=False):
    """Cumulative figures cuzk does not serve; the exporter needs them for exact counters."""

    #: proof_kind -> phase (one of COUNTED_PHASES) -> partitions that entered it since start.
    phase_transitions: dict[str, dict[str, NonNegInt]]
    #: per worker, monotonic busy seconds including the running span.
    worker_busy: list[WorkerBusyTotal]
    #: proof_kind -> histogram of finished synthesis / GPU phase durations in seconds.
    synth_duration_seconds: dict[str, Histogram]
    gpu_duration_seconds: dict[str, Histogram]
    #: jobs accepted and not yet finished (pipelines only lists partitioned jobs).
    jobs_in_flight: NonNegInt
    gpu_devices: list[GpuDevice] = msgspec.field(default_factory=list)
    backend: str = "unknown"
    #: proof_kind -> histogram of finished jobs' end-to-end durations (accepted -> finished,
    #: successful or not) over JOB_DURATION_BUCKETS.
    job_duration_seconds: dict[str, Histogram] = msgspec.field(default_factory=dict)
    #: the engine is draining: accepts no job, finishes those it accepted, then exits
    draining: bool = False


class StatusDocument(msgspec.Struct, frozen=True, gc=False):
    """cuzk's ``GET /status`` document (all fields required) plus optional extensions."""

    uptime_secs: NonNegFloat
    memory: Memory
    synthesis: Synthesis
    pipelines: list[Pipeline]
    gpu_workers: list[GpuWorker]
    allocations: Allocations
    counters: Counters
    buffers: Buffers
    cuzkd_extensions: Extensions | None = None


class StatusDecodeError(ValueError):
    """The bytes are not a valid status document; the message says which field is wrong."""


_DECODER = msgspec.json.Decoder(StatusDocument)
_ENCODER = msgspec.json.Encoder()


def decode_status(data: bytes | str) -> StatusDocument:
    """Decode and validate a status document from JSON."""
    try:
        return _DECODER.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError is a subclass
        raise StatusDecodeError(str(exc)) from exc


def _with_field_type(struct: type[msgspec.Struct], name: str, field_type: object,
                     ) -> type[msgspec.Struct]:
    """A copy of ``struct`` (same fields and defaults, ``gc=False``) with field ``name``
    retyped."""
    fields: list[tuple[str, object] | tuple[str, object, object]] = []
    for f in msgspec.structs.fields(struct):
        kind = field_type if f.name == name else f.type
        default = (f.default if f.default_factory is msgspec.NODEFAULT
                   else msgspec.field(default_factory=f.default_factory))
        fields.append((f.name, kind) if f.required else (f.name, kind, default))
    return msgspec.defstruct(f"_Raw{struct.__name__}", fields, gc=False)


#: StatusDocument and Pipeline with each job's partitions kept as raw JSON (see StatusDecoder).
_RawPipeline = _with_field_type(Pipeline, "partitions", msgspec.Raw)
_RawDocument = _with_field_type(StatusDocument, "pipelines", list[_RawPipeline])  # type: ignore[valid-type]
_RAW_DECODER = msgspec.json.Decoder(_RawDocument)
_PARTITIONS_DECODER = msgspec.json.Decoder(list[Partition])
_DOCUMENT_FIELDS = tuple(f for f in StatusDocument.__struct_fields__ if f != "pipelines")
_PIPELINE_FIELDS = tuple(f for f in Pipeline.__struct_fields__ if f != "partitions")


class StatusDecoder:
    """:func:`decode_status` for successive documents of one engine, reusing what did not change.

    A busy engine lists hundreds of jobs x 16 partitions, and between two documents most jobs'
    partitions are the very same bytes: building their ~8,000 structs again is most of the
    cost of decoding. Each job's partitions are first kept as raw JSON; those byte-identical to
    the same job's at the previous decode reuse its decoded list (the same list object, which
    also makes the deriver's, the stall watch's and the exporter's "listed as before" checks
    identity checks), the others are decoded. The result equals :func:`decode_status`'s, and a
    document that does not decode raises its error (decoded again whole, so that the message
    names the field's full path). Only the jobs of the last document are remembered.
    """

    def __init__(self) -> None:
        #: job_id -> (its partitions' raw JSON, decoded) at the last decode
        self._jobs: dict[str, tuple[msgspec.Raw, list[Partition]]] = {}

    def decode(self, data: bytes) -> StatusDocument:
        try:
            raw: Any = _RAW_DECODER.decode(data)
            before, jobs = self._jobs, {}
            pipelines = []
            for pipeline in raw.pipelines:
                memo = before.get(pipeline.job_id)
                if memo is not None and memo[0] == pipeline.partitions:
                    partitions = memo[1]
                else:
                    partitions = _PARTITIONS_DECODER.decode(pipeline.partitions)
                jobs[pipeline.job_id] = (pipeline.partitions, partitions)
                pipelines.append(Pipeline(**{f: getattr(pipeline, f) for f in _PIPELINE_FIELDS},
                                          partitions=partitions))
        except msgspec.DecodeError:
            self._jobs = {}
            return decode_status(data)  # raises, naming the field by its path in the document
        self._jobs = jobs
        return StatusDocument(**{f: getattr(raw, f) for f in _DOCUMENT_FIELDS},
                              pipelines=pipelines)


def encode_status(doc: StatusDocument) -> bytes:
    """Encode a status document as JSON (extensions omitted when ``None``)."""
    if doc.cuzkd_extensions is None:
        raw = msgspec.to_builtins(doc)
        raw.pop("cuzkd_extensions", None)
        return _ENCODER.encode(raw)
    return _ENCODER.encode(doc)
