"""A proof job of the bundled engine, what a request for one may ask, and the errors a
submission may get."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from cuzkd.bundled import prover
from cuzkd.bundled.settings import MAX_SIZE_LOG2, MIN_SIZE_LOG2, PARTITIONS, ProverConfig
from cuzkd.errors import JobRequestError
from cuzkd.priority import Priority


class JobState(enum.StrEnum):
    """Where a job of the bundled engine is: the ``state`` of its HTTP API's job views."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


MAX_PARTITIONS = 1024
#: The error of the partition a test-only failure rate fails (ProverConfig.test_failure_rate).
INJECTED_FAILURE = "injected failure (test-only failure rate)"


def checked_request(config: ProverConfig, proof_kind: str, partitions: int | None,
                    size_log2: int | None) -> tuple[int, int]:
    """A request's partition count and log2 partition size, the kind's defaults filling what it
    leaves out; JobRequestError naming the field that is out of range."""
    if proof_kind not in PARTITIONS:
        raise JobRequestError(
            f"unknown proof_kind {proof_kind!r}; known: {sorted(PARTITIONS)}")
    count = PARTITIONS[proof_kind] if partitions is None else partitions
    if not 1 <= count <= MAX_PARTITIONS:
        raise JobRequestError(f"partitions must be between 1 and {MAX_PARTITIONS}")
    log_n = config.size_log2(proof_kind) if size_log2 is None else size_log2
    if not MIN_SIZE_LOG2 <= log_n <= MAX_SIZE_LOG2:
        raise JobRequestError(
            f"size_log2 must be between {MIN_SIZE_LOG2} and {MAX_SIZE_LOG2}")
    return count, log_n


def injected_failure(number: int, rate: float) -> bool:
    """Whether job ``number`` (1, 2, ...) is one a failure ``rate`` fails: deterministic, so
    exactly ``floor(n * rate)`` of the first n jobs fail (rate 1/3: every third)."""
    return int(number * rate + 1e-9) > int((number - 1) * rate + 1e-9)


@dataclass
class Span:
    """The wall-clock time from the first start to the last end of one phase of a job's
    partitions (they overlap, so it is no sum): a proof's synthesis or GPU time as a gRPC
    reply reports it."""

    start: float | None = None
    end: float | None = None

    def cover(self, start: float, end: float) -> None:
        self.start = start if self.start is None else min(self.start, start)
        self.end = end if self.end is None else max(self.end, end)

    @property
    def seconds(self) -> float:
        return 0.0 if self.start is None or self.end is None else self.end - self.start


@dataclass
class Job:
    """One proof job as the API reports it. Times are on the engine's clock (``Engine.now``)."""

    job_id: str
    proof_kind: str
    partitions: int
    size_log2: int
    submitted_at: float
    #: the id its client knows it by: cuzk's gRPC ``request_id`` (``job_id`` when none was
    #: given); unlike ``job_id`` not unique over time -- a retry reuses it
    request_id: str = ""
    #: higher is admitted first; HTTP jobs are NORMAL
    priority: Priority = Priority.NORMAL
    state: JobState = JobState.QUEUED
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    admitted: int = 0
    remaining: int = 0
    synth_secs: list[float | None] = field(default_factory=list)
    gpu_secs: list[float | None] = field(default_factory=list)
    proofs: list[prover.Proof | None] = field(default_factory=list)
    verified: list[bool] = field(default_factory=list)
    #: chosen by the test-only failure rate: its first finished partition fails
    doomed: bool = False
    synth_span: Span = field(default_factory=Span)
    #: the device phase and the finalizer (cuzk's ``gpu_ms`` includes the finalizer too)
    gpu_span: Span = field(default_factory=Span)
    #: set once the job is finished (done or failed): what a gRPC ``Prove`` waits for
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.request_id = self.request_id or self.job_id
        self.remaining = self.partitions
        self.synth_secs = [None] * self.partitions
        self.gpu_secs = [None] * self.partitions
        self.proofs = [None] * self.partitions
        self.verified = [False] * self.partitions

    @property
    def failed(self) -> bool:
        return self.error is not None
