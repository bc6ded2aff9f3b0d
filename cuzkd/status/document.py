"""The typed ``/status`` document: cuzk's fields exactly, plus cuzkd's optional extensions.

These structs are the single definition of the document. The reference engine encodes them,
the supervisor and the exporter decode them -- from our engine and from a real cuzk daemon
alike. Every field of cuzk's document is required; unknown fields are ignored so a newer cuzk
stays readable. The extensions live under one key, ``cuzkd_extensions``, which a real cuzk
never sends.

:func:`decode_status` is the strict validator (our engine's documents must pass it).
:class:`StatusDecoder` reads engines: a document it cannot decode strictly is salvaged field by
field (:mod:`cuzkd.status.salvage`), so one odd value costs that value, not the document. That is
why the figures of the singleton sections (``uptime_secs``, ``memory``, ``synthesis``, the
counters and the counts per proof kind, ``buffers``, ``jobs_in_flight``, the phase counts) are
``| None``: ``None`` is a value the engine served that did not decode (or a JSON ``null``), and
every consumer leaves it out.

See ``tests/fixtures/cuzk-status.md`` (a copy of cuzk's description) for cuzk's field list
and ``docs/status.md`` for the extensions.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, Any, NamedTuple, TypeVar

import msgspec

from cuzkd.errors import StatusDecodeError, Unsalvageable
from cuzkd.errortext import error_text
from cuzkd.kinds import ProofKind, normalise_kind
from cuzkd.status.salvage import FieldError, FieldErrorReason, Salvage

#: cuzk's unsigned integers. The upper bound matters: JSON integers decode to arbitrary-precision
#: Python ints, and one too large for a float (10**400) would make the exporter's ``float()``
#: raise and fail the whole scrape; such a document is malformed instead (msgspec bounds stop at
#: int64, far above any real count or byte size).
NonNegInt = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]
#: A count or size of a singleton section, or a count per proof kind or phase: None when the
#: engine's value did not decode (see StatusDecoder) -- unknown, never 0.
Figure = NonNegInt | None

#: cuzk's proof kinds and the partitions each job of the kind has. Shared by the engine (which
#: splits jobs), ``cuzkd bench`` (its ``--kind`` choices) and the demo load.
PARTITIONS: dict[str, int] = {ProofKind.POREP_C2: 10, ProofKind.SNAP_UPDATE: 16,
                              ProofKind.WINDOW_POST: 1, ProofKind.WINNING_POST: 1}

class PartitionState(enum.StrEnum):
    """A partition's phase, in pipeline order (``failed`` can follow any of them): the
    ``phase`` label of the partition series."""

    PENDING = "pending"
    SYNTHESIZING = "synthesizing"
    SYNTH_DONE = "synth_done"
    GPU = "gpu"
    DONE = "done"
    FAILED = "failed"


class WorkerState(enum.StrEnum):
    """What a GPU worker is doing."""

    IDLE = "idle"
    PROVING = "proving"


#: Where a partition ends: it never leaves these.
TERMINAL_STATES: frozenset[PartitionState] = frozenset({PartitionState.DONE, PartitionState.FAILED})
#: Work started and not finished: what a stop now would throw away.
IN_FLIGHT_STATES: frozenset[PartitionState] = frozenset({
    PartitionState.SYNTHESIZING, PartitionState.SYNTH_DONE, PartitionState.GPU})
#: Compute in progress: a quiet moment has none of these.
BUSY_STATES: frozenset[PartitionState] = frozenset({
    PartitionState.SYNTHESIZING, PartitionState.GPU})

#: The phases whose entries are counted cumulatively (``pending`` is where partitions start).
COUNTED_PHASES: tuple[PartitionState, ...] = tuple(
    state for state in PartitionState if state is not PartitionState.PENDING)

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


# Every struct below is ``gc=False``: a document is a tree (frozen, never referring back to
# itself), so the cycle collector need not track its thousands of partitions -- tracking them
# doubled the cost of decoding a busy engine's 1 MB document.

class Memory(msgspec.Struct, frozen=True, gc=False):
    total_bytes: Figure
    used_bytes: Figure
    available_bytes: Figure


class Synthesis(msgspec.Struct, frozen=True, gc=False):
    max_concurrent: Figure
    active: Figure


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
    total_completed: Figure
    total_failed: Figure
    completed_by_kind: dict[str, Figure]
    failed_by_kind: dict[str, Figure]
    queue_depth: Figure


class Buffers(msgspec.Struct, frozen=True, gc=False):
    synth_in_flight: Figure
    provers_in_flight: Figure
    aux_in_flight: Figure
    shells_in_flight: Figure
    pending_handles: Figure


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


class StaleJob(msgspec.Struct, frozen=True, gc=False):
    """A listed job that is failed work (a plain cuzk's: :mod:`cuzkd.status.failedwork`);
    not in flight, not queued GPU work, not synthesizing."""

    job_id: str
    proof_kind: str
    #: the job's ``started_secs_ago``
    age_secs: NonNegFloat
    #: seconds since a partition of it last moved (as seen by polls)
    idle_secs: NonNegFloat
    failed_partitions: NonNegInt


class Extensions(msgspec.Struct, frozen=True, gc=False):
    """Cumulative figures cuzk does not serve; the exporter needs them for exact counters."""

    #: proof_kind -> phase (one of COUNTED_PHASES) -> partitions that entered it since start.
    phase_transitions: dict[str, dict[str, Figure]]
    #: per worker, monotonic busy seconds including the running span.
    worker_busy: list[WorkerBusyTotal]
    #: proof_kind -> histogram of finished synthesis / GPU phase durations in seconds.
    synth_duration_seconds: dict[str, Histogram]
    gpu_duration_seconds: dict[str, Histogram]
    #: jobs accepted and not yet finished (pipelines only lists partitioned jobs).
    jobs_in_flight: Figure
    gpu_devices: list[GpuDevice] = msgspec.field(default_factory=list)
    backend: str = "unknown"
    #: proof_kind -> histogram of finished jobs' end-to-end durations (accepted -> finished,
    #: successful or not) over JOB_DURATION_BUCKETS.
    job_duration_seconds: dict[str, Histogram] = msgspec.field(default_factory=dict)
    #: the engine is draining: accepts no job, finishes those it accepted, then exits
    draining: bool = False
    #: listed jobs that are failed work (derived for a plain cuzk only)
    stale_jobs: list[StaleJob] = msgspec.field(default_factory=list)
    #: workers shown ``proving`` a partition that is not in ``gpu`` in a live job, two polls in
    #: a row: not busy (derived for a plain cuzk only)
    phantom_busy_workers: list[NonNegInt] = msgspec.field(default_factory=list)
    #: reason -> such phantom-busy spans since the engine started
    phantom_busy_total: dict[str, NonNegInt] = msgspec.field(default_factory=dict)
    #: the last non-empty ``allocations.srs`` while the document's is empty, for a bounded time
    #: (a real cuzk serves ``[]`` while its SRS manager is busy; derived only)
    held_srs: list[Allocation] = msgspec.field(default_factory=list)


class StatusDocument(msgspec.Struct, frozen=True, gc=False):
    """cuzk's ``GET /status`` document (all fields required) plus optional extensions."""

    uptime_secs: NonNegFloat | None
    memory: Memory
    synthesis: Synthesis
    pipelines: list[Pipeline]
    gpu_workers: list[GpuWorker]
    allocations: Allocations
    counters: Counters
    buffers: Buffers
    cuzkd_extensions: Extensions | None = None


_DECODER = msgspec.json.Decoder(StatusDocument)
_ENCODER = msgspec.json.Encoder()


def decode_status(data: bytes | str) -> StatusDocument:
    """Decode and validate a status document from JSON, strictly: any bad value refuses it."""
    try:
        document = _DECODER.decode(data)
    except Exception as exc:  # DecodeError, and RecursionError for JSON nested too deep
        raise _refusal(exc) from exc
    return _with_cuzk_kinds(document)


_Struct = TypeVar("_Struct", bound=msgspec.Struct)
_Value = TypeVar("_Value")
#: The kind-keyed maps of the sections that have them.
_COUNTERS_BY_KIND = ("completed_by_kind", "failed_by_kind")
_EXTENSIONS_BY_KIND = ("phase_transitions", "synth_duration_seconds", "gpu_duration_seconds",
                       "job_duration_seconds")


def _with_cuzk_kinds(document: StatusDocument) -> StatusDocument:
    """``document`` with every proof kind named as cuzk names it
    (:func:`cuzkd.kinds.normalise_kind`).

    A real cuzk already does: then nothing is copied. An older reference engine (a release
    swapped back to) says ``porep``; after this its jobs count in the same ``porep-c2`` series
    as before the swap. A map naming one kind twice (``porep`` and ``porep-c2``) keeps the
    entry with cuzk's name, so a kind never gets two values for one series.
    """
    pipelines = document.pipelines
    if any(normalise_kind(p.proof_kind) != p.proof_kind for p in pipelines):
        pipelines = [msgspec.structs.replace(p, proof_kind=normalise_kind(p.proof_kind))
                     for p in pipelines]
    counters = _kinds_renamed(document.counters, _COUNTERS_BY_KIND)
    extensions = document.cuzkd_extensions
    if extensions is not None:
        extensions = _kinds_renamed(extensions, _EXTENSIONS_BY_KIND)
    if (pipelines is document.pipelines and counters is document.counters
            and extensions is document.cuzkd_extensions):
        return document
    return msgspec.structs.replace(document, pipelines=pipelines, counters=counters,
                                   cuzkd_extensions=extensions)


def _kinds_renamed(section: _Struct, fields: tuple[str, ...]) -> _Struct:
    """``section`` with the kind-keyed maps ``fields`` renamed; itself when none needs it."""
    changes = {name: renamed for name in fields
               if (renamed := _renamed(getattr(section, name))) is not None}
    return msgspec.structs.replace(section, **changes) if changes else section


def _renamed(by_kind: dict[str, _Value]) -> dict[str, _Value] | None:
    """``by_kind`` keyed by cuzk's names (an alias of a kind also listed by cuzk's name is
    dropped); None when every key already is one."""
    if all(normalise_kind(kind) == kind for kind in by_kind):
        return None
    return {normalise_kind(kind): value for kind, value in by_kind.items()
            if normalise_kind(kind) == kind or normalise_kind(kind) not in by_kind}


def _refusal(exc: Exception) -> StatusDecodeError:
    """A decoder's exception as the error of a document that is not one: msgspec's and the
    salvage's messages as they are (they name the field), anything else with its type."""
    known = isinstance(exc, msgspec.DecodeError | Unsalvageable)
    return StatusDecodeError(str(exc) if known else error_text(exc))


class Decoded(NamedTuple):
    """A document as :class:`StatusDecoder` read it, and the values it had to leave out: the
    first ones (salvage.MAX_DETAILED) one by one, all of them counted by reason."""

    document: StatusDocument
    field_errors: tuple[FieldError, ...] = ()
    field_error_counts: Mapping[FieldErrorReason, int] = {}

    def left_out(self) -> str | None:
        """The first field error with its path, and how many more; None for none."""
        if not self.field_errors:
            return None
        more = sum(self.field_error_counts.values()) - 1
        return f"left out: {self.field_errors[0]}" + (f" (and {more} more)" if more else "")


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
_RAW_PIPELINES_DECODER = msgspec.json.Decoder(list[_RawPipeline])  # type: ignore[valid-type]
_PARTITIONS_DECODER = msgspec.json.Decoder(list[Partition])
_DOCUMENT_FIELDS = tuple(f for f in StatusDocument.__struct_fields__ if f != "pipelines")
_PIPELINE_FIELDS = tuple(f for f in Pipeline.__struct_fields__ if f != "partitions")

#: job_id -> (its partitions' raw JSON, decoded), the memo of StatusDecoder
_Jobs = dict[str, tuple[msgspec.Raw, list[Partition]]]


class StatusDecoder:
    """Successive documents of one engine, decoded reusing what did not change, salvaging what
    does not decode.

    A busy engine lists hundreds of jobs x 16 partitions, and between two documents most jobs'
    partitions are the very same bytes: building their ~8,000 structs again is most of the
    cost of decoding. Each job's partitions are first kept as raw JSON; those byte-identical to
    the same job's at the previous decode reuse its decoded list (the same list object, which
    also makes the deriver's, the stall watch's and the exporter's "listed as before" checks
    identity checks), the others are decoded. The result equals :func:`decode_status`'s.

    A document that fails that strict decode is salvaged (:mod:`cuzkd.status.salvage`): the
    values that do not decode are left out and returned as field errors, the pipelines still
    decoded with the reuse when they are not where the error is. While documents need the
    salvage, the next one goes straight to it: a wrapped counter stays wrapped until the engine
    restarts, and the strict attempt would only fail again (a 1 MB document: ~1.5x the strict
    decode instead of ~2.2x; a clean one costs ~1.4x once, then the strict decode is back).
    Raises StatusDecodeError only for what is no status document: not JSON, not an object, a
    section missing or not an object, JSON nested too deep to decode at all. Only the jobs of
    the last document are remembered.
    """

    def __init__(self) -> None:
        self._jobs: _Jobs = {}
        #: the last document was salvaged and had values left out
        self._salvaging = False

    def decode(self, data: bytes) -> Decoded:
        if not self._salvaging:
            try:
                return self._decode_strict(data)
            except msgspec.DecodeError:  # ValidationError is a subclass
                pass
            except Exception as exc:  # RecursionError: the salvage would meet it again
                self._jobs = {}
                raise _refusal(exc) from exc
        decoded = self._salvage(data)
        self._salvaging = bool(decoded.field_error_counts)
        return decoded

    def _decode_strict(self, data: bytes) -> Decoded:
        raw: Any = _RAW_DECODER.decode(data)
        jobs: _Jobs = {}
        pipelines = self._pipelines(raw.pipelines, jobs)
        self._jobs = jobs
        return Decoded(_with_cuzk_kinds(StatusDocument(
            **{f: getattr(raw, f) for f in _DOCUMENT_FIELDS}, pipelines=pipelines)))

    def _salvage(self, data: bytes) -> Decoded:
        jobs: _Jobs = {}

        def pipelines(raw: msgspec.Raw) -> list[Pipeline]:
            return self._pipelines(_RAW_PIPELINES_DECODER.decode(raw), jobs)

        walk = Salvage(first={"pipelines": pipelines})
        try:
            document: StatusDocument = walk.document(StatusDocument, data)
        except Exception as exc:
            self._jobs, self._salvaging = {}, False
            raise _refusal(exc) from exc
        self._jobs = jobs  # the jobs decoded with the reuse (before an odd one, if any)
        return Decoded(_with_cuzk_kinds(document), tuple(walk.errors), dict(walk.counts))

    def _pipelines(self, raw_pipelines: list[Any], jobs: _Jobs) -> list[Pipeline]:
        """Pipelines with partitions kept raw -> decoded, reusing the previous decode's lists;
        fills ``jobs`` (the memo for the next decode)."""
        before = self._jobs
        pipelines = []
        for pipeline in raw_pipelines:
            memo = before.get(pipeline.job_id)
            if memo is not None and memo[0] == pipeline.partitions:
                partitions = memo[1]
            else:
                partitions = _PARTITIONS_DECODER.decode(pipeline.partitions)
            jobs[pipeline.job_id] = (pipeline.partitions, partitions)
            pipelines.append(Pipeline(**{f: getattr(pipeline, f) for f in _PIPELINE_FIELDS},
                                      partitions=partitions))
        return pipelines


def encode_status(doc: StatusDocument) -> bytes:
    """Encode a status document as JSON (extensions omitted when ``None``)."""
    if doc.cuzkd_extensions is None:
        raw = msgspec.to_builtins(doc)
        raw.pop("cuzkd_extensions", None)
        return _ENCODER.encode(raw)
    return _ENCODER.encode(doc)
