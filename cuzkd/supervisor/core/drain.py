"""The stop sequence's drain, read from a status document: is this a quiet moment, what would a
stop now throw away.

Every supervisor-initiated stop (operator, reload, swap, shutdown) first lets in-flight work end
(docs/supervisor.md, the stop sequence): ``quiet`` waits for a moment with no partition
synthesizing or on a GPU; ``cuzk`` waits for one with no *job* held by the engine -- in
``/status`` or in ``GetStatus``'s queues -- because cuzk cannot drain (SIGINT strands work,
SIGTERM kills at once) and a job is worth something only whole. Pure: a document (and a
``GetStatus`` reading) in, a count or a verdict out; the drain request (``http``) is
:mod:`cuzkd.supervisor.engines.drainrequest`, the reading :mod:`cuzkd.cuzk.client`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuzkd.cuzk.reading import QueueReading
from cuzkd.kinds import reported_kind
from cuzkd.states import WORK_LOST_REASONS, StopReason
from cuzkd.status.document import BUSY_STATES, IN_FLIGHT_STATES, PartitionState, StatusDocument
from cuzkd.supervisor.core.doorbook import EngineReading

#: A partition's states once it has left cuzk's GPU queue: on a GPU, or finished either way.
PAST_GPU_QUEUE: frozenset[PartitionState] = frozenset({
    PartitionState.GPU, PartitionState.DONE, PartitionState.FAILED})


def count_partitions(doc: StatusDocument | None, states: frozenset[PartitionState]) -> int:
    """Partitions of the listed jobs in one of ``states`` (0 without a document)."""
    if doc is None:
        return 0
    return sum(part.state in states for pipe in doc.pipelines for part in pipe.partitions)


def is_quiet(doc: StatusDocument) -> bool:
    """No partition synthesizing or on a GPU: stopping now loses no compute in progress."""
    return count_partitions(doc, BUSY_STATES) == 0


def jobs_in_flight(doc: StatusDocument | None) -> dict[str, list[str]]:
    """Kind label -> ids of the jobs ``/status`` shows in flight: a partition not ``done``
    and none ``failed`` (cuzk never finishes a job with a failed partition: it stays listed for
    good, and waiting for it would hold every stop to its drain_timeout)."""
    jobs: dict[str, list[str]] = {}
    for pipe in doc.pipelines if doc is not None else ():
        states = {part.state for part in pipe.partitions}
        if PartitionState.FAILED not in states and states - {PartitionState.DONE}:
            jobs.setdefault(reported_kind(pipe.proof_kind), []).append(pipe.job_id)
    return jobs


def cuzk_idle(doc: StatusDocument, queues: QueueReading) -> bool:
    """A cuzk's quiet moment: no job in flight in ``/status`` and ``GetStatus`` known to show
    nothing pending or in progress for any kind (which covers WindowPoSt and WinningPoSt,
    absent from ``/status``). A stop now throws no job away."""
    return not jobs_in_flight(doc) and not queues.holds_work


def door_reading(doc: StatusDocument | None, queues: QueueReading | None) -> EngineReading:
    """What the door's book reads of an engine: the jobs ``/status`` lists, those whose
    partition 0 left cuzk's GPU queue, and the ``GetStatus`` queues (None: not read)."""
    if doc is None:
        return EngineReading(None, queues=queues)
    jobs = frozenset(pipe.job_id for pipe in doc.pipelines)
    past = frozenset(pipe.job_id for pipe in doc.pipelines
                     if any(p.index == 0 and p.state in PAST_GPU_QUEUE for p in pipe.partitions))
    return EngineReading(jobs, past, queues)


@dataclass(frozen=True)
class LostJobs:
    """What a stop signal now would throw away, job by job (Curio redoes a lost job whole)."""

    #: kind label -> jobs
    by_kind: dict[str, int]
    #: the ids known (``/status``'s jobs, the GPUs' current jobs), for the log
    job_ids: tuple[str, ...]


def lost_jobs(doc: StatusDocument | None, queues: QueueReading | None) -> LostJobs:
    """Jobs held by the engine, per kind: those in flight in ``/status`` or, where a known
    ``GetStatus`` counts more (jobs queued, PoSt proofs), its pending + in_progress (the same
    jobs seen twice are counted once: the larger count of the two)."""
    shown = jobs_in_flight(doc)
    by_kind = {kind: len(ids) for kind, ids in shown.items()}
    current: tuple[str, ...] = ()
    if queues is not None and queues.known:
        for kind, queue in queues.queues.items():
            by_kind[kind] = max(by_kind.get(kind, 0), queue.jobs)
        current = queues.current_jobs
    ids = [job for ids in shown.values() for job in ids]
    return LostJobs({k: n for k, n in by_kind.items() if n},
                    tuple(dict.fromkeys([*ids, *current])))


@dataclass(frozen=True)
class LostWork:
    """What one stop threw away: the partitions in flight, and the jobs held."""

    partitions: int
    jobs: LostJobs


def lost_work(reason: StopReason, doc: StatusDocument | None, queues: QueueReading | None, *,
              status_polled: bool, drained_clean: bool) -> LostWork | None:
    """What a stop for ``reason`` throws away as the engine is signalled, by its last status
    ``doc`` (and, for a cuzk engine, the drain's last ``queues``); None when it is not counted:
    a health kill (:data:`~cuzkd.states.WORK_LOST_REASONS`), an engine without a status
    (``status_polled``), or a stop the door ``drained_clean`` (it saw every call end, while
    the last status may list jobs done since)."""
    if reason not in WORK_LOST_REASONS or not status_polled or drained_clean:
        return None
    return LostWork(count_partitions(doc, IN_FLIGHT_STATES), lost_jobs(doc, queues))
