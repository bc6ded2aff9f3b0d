"""Failed work a real cuzk leaves in its ``/status`` document, recognised from successive polls.

cuzk never finishes failed work in the document (``docs/status.md``): after a synthesis or GPU
error the job stays in ``pipelines`` for good, its partitions can stay ``gpu`` and its worker
can stay ``proving`` until it starts another partition. Read at face value, a long-running
engine's failed work is in flight, queued GPU work, synthesizing, progress for the stall
watchdog, and busy workers. :class:`JobProgress` tells them apart:

* A job is **stale** when it has a ``failed`` partition, or has made no progress -- no
  partition state change and no ``partitions_done`` change -- for ``stale_after`` seconds
  (``synth_ms``/``gpu_ms`` tick while a phase runs: they are not progress). A job whose every
  partition is ``done`` is finished, never stale.
* A job id seen again with a smaller ``started_secs_ago`` (its start moved later by more than
  :data:`RETRY_SLACK_SECS`) is a **new job**: Curio's retries reuse ids.

Pure: fed ``now``, it keeps one small record per listed job and forgets jobs that leave.
"""

from __future__ import annotations

from cuzkd.status.document import PartitionState, Pipeline

#: How long a job may go without a partition moving before it is stale. cuzk's slowest steps
#: are a partition's synthesis (30-37 s), an SRS reload (30-90 s) and a whole PoRep on a small
#: host (~150 s); with its GPU runs of 2-8 s a live job's partitions move far more often than
#: every 10 minutes, even behind other jobs (cuzk dispatches a job's partitions as synthesis
#: capacity frees, and a started job's partitions go first).
STALE_AFTER_SECS = 600.0

#: How much later a job id's start may appear before it is a new job: covers the jitter
#: between a document's generation and our observation of it (as the deriver's restart
#: slack does); a retry starts far later, after its predecessor failed.
RETRY_SLACK_SECS = 5.0


class _Seen:
    __slots__ = ("done", "progress_at", "started", "states")

    def __init__(self, started: float, states: tuple[PartitionState, ...], done: int,
                 now: float) -> None:
        self.started = started
        self.states = states
        self.done = done
        self.progress_at = now


class JobProgress:
    """The progress of each listed job, across polls; see the module docstring."""

    def __init__(self, stale_after: float = STALE_AFTER_SECS) -> None:
        self._stale_after = stale_after
        self._jobs: dict[str, _Seen] = {}
        self._observing: dict[str, _Seen] = {}

    def begin(self) -> None:
        """Start folding in one document (its pipelines follow through :meth:`observe`)."""
        self._observing = {}

    def observe(self, pipeline: Pipeline, now: float) -> bool:
        """Fold in one listed job; True when it is a new job under an id seen before."""
        started = now - pipeline.started_secs_ago
        states = tuple(p.state for p in pipeline.partitions)
        seen = self._jobs.get(pipeline.job_id)
        renewed = seen is not None and started > seen.started + RETRY_SLACK_SECS
        if seen is None or renewed:
            seen = _Seen(started, states, pipeline.partitions_done, now)
        elif states != seen.states or pipeline.partitions_done != seen.done:
            seen.states, seen.done, seen.progress_at = states, pipeline.partitions_done, now
        self._observing[pipeline.job_id] = seen
        return renewed

    def end(self) -> None:
        """Finish the document: jobs it did not list are forgotten."""
        self._jobs = self._observing

    def stale(self, pipeline: Pipeline, now: float) -> bool:
        """The job (observed in this document) is failed work."""
        states = [p.state for p in pipeline.partitions]
        if PartitionState.FAILED in states:
            return True
        if all(state == PartitionState.DONE for state in states):
            return False  # finished (a job without partitions: nothing left to do)
        seen = self._observing.get(pipeline.job_id)
        return seen is not None and now - seen.progress_at >= self._stale_after

    def idle_secs(self, job_id: str, now: float) -> float:
        """Seconds since the job last made progress (0 for a job not observed)."""
        seen = self._observing.get(job_id)
        return 0.0 if seen is None else now - seen.progress_at
