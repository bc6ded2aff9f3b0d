"""The jobs the bundled engine accepted: their ids, their lookup by the client's request id,
how many are still open, and each one's end (its state, its log line, its retention)."""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
from collections import deque
from collections.abc import Callable

import structlog

from cuzkd.bundled.budget import MemoryBudget
from cuzkd.bundled.jobs import Job, JobState, injected_failure
from cuzkd.priority import Priority
from cuzkd.status.tracker import StatusTracker

_log = structlog.get_logger("cuzkd.engine")


class JobBook:
    """Every accepted job until it is finished and retention drops it; the one place a job's
    partitions are counted down and the job is finished."""

    def __init__(self, tracker: StatusTracker, budget: MemoryBudget, *,
                 clock: Callable[[], float], publish: Callable[[], None],
                 retain_jobs: int) -> None:
        """``publish``: pushes the engine's gauges once a partition ended."""
        self._tracker = tracker
        self._budget = budget
        self._clock = clock
        self._publish = publish
        self._retain_jobs = retain_jobs
        self.jobs: dict[str, Job] = {}
        #: request_id -> the latest job submitted under it, retained as long as ``jobs`` is
        self.requests: dict[str, Job] = {}
        self._finished: deque[str] = deque()
        self._ids = itertools.count(1)
        self._id_salt = f"{os.getpid()}-{secrets.token_hex(3)}"
        self._open_jobs = 0
        #: set while no accepted job is open (what a drain waits for)
        self._no_open_jobs = asyncio.Event()
        self._no_open_jobs.set()

    @property
    def open_jobs(self) -> int:
        """Accepted jobs not finished yet."""
        return self._open_jobs

    async def all_finished(self) -> None:
        """Wait until no accepted job is open."""
        await self._no_open_jobs.wait()

    def accept(self, proof_kind: str, partitions: int, size_log2: int, request_id: str,
               priority: Priority, failure_rate: float) -> Job:
        """A new open job under a fresh id, registered with the tracker; ``failure_rate``: the
        test-only share of jobs doomed to fail (ProverConfig.test_failure_rate)."""
        number = next(self._ids)
        job_id = f"ref-{proof_kind}-{self._id_salt}-{number}"
        job = Job(job_id=job_id, proof_kind=proof_kind, partitions=partitions,
                  size_log2=size_log2, submitted_at=self._clock(), request_id=request_id,
                  priority=priority)
        self.jobs[job_id] = job
        self.requests[job.request_id] = job
        self._tracker.register_job(job_id, proof_kind, partitions)
        self._open_jobs += 1
        self._no_open_jobs.clear()
        job.doomed = injected_failure(number, failure_rate)
        return job

    def partition_failed(self, job: Job, index: int, error: str) -> None:
        """An admitted partition failed: its grant goes back and the job fails with the first
        partition's error."""
        self._tracker.partition_failed(job.job_id, index)
        self._budget.release((job.job_id, index))
        if job.error is None:
            job.error = f"partition {index}: {error}"
        self.partition_ended(job)

    def partition_ended(self, job: Job) -> None:
        """An admitted partition is done or failed."""
        job.remaining -= 1
        self._finish_if_done(job)
        self._publish()

    def fail_unadmitted(self, job: Job, error: str) -> None:
        """Fail the partitions the scheduler has not admitted (none if all were)."""
        if job.admitted == job.partitions:
            return
        if job.error is None:
            job.error = error
        for index in range(job.admitted, job.partitions):
            self._tracker.partition_failed(job.job_id, index)
        job.remaining -= job.partitions - job.admitted
        job.admitted = job.partitions
        self._finish_if_done(job)

    def fail_open(self, error: str) -> None:
        """Fail every accepted job that is not finished, partitions in flight included (the
        engine is about to exit: they would never finish)."""
        for job in list(self.jobs.values()):
            if job.finished_at is not None:
                continue
            if job.error is None:
                job.error = error
            for index, proof in enumerate(job.proofs):
                if proof is None:
                    self._tracker.partition_failed(job.job_id, index)
            job.admitted = job.partitions
            job.remaining = 0
            self._finish_if_done(job)

    def _finish_if_done(self, job: Job) -> None:
        if job.remaining > 0 or job.finished_at is not None:
            return
        job.finished_at = self._clock()
        self._open_jobs -= 1
        if self._open_jobs == 0:
            self._no_open_jobs.set()
        job.state = JobState.FAILED if job.failed else JobState.DONE
        self._tracker.job_completed(job.job_id, job.proof_kind, not job.failed)
        wall = round(job.finished_at - job.submitted_at, 6)
        if job.failed:
            _log.warning("job_failed", job_id=job.job_id, proof_kind=job.proof_kind,
                         error=job.error, wall_secs=wall)
        else:
            _log.info("job_finished", job_id=job.job_id, proof_kind=job.proof_kind,
                      partitions=job.partitions, verified=all(job.verified), wall_secs=wall)
        job.finished.set()
        self._retain(job)

    def _retain(self, job: Job) -> None:
        """Keep the last ``retain_jobs`` finished jobs; older ones are forgotten, their request
        id too unless a later job took it over."""
        self._finished.append(job.job_id)
        while len(self._finished) > self._retain_jobs:
            dropped = self.jobs.pop(self._finished.popleft(), None)
            if dropped is not None and self.requests.get(dropped.request_id) is dropped:
                del self.requests[dropped.request_id]
