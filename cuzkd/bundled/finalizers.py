"""The bundled engine's finalizers: one task per proved partition commits and verifies the
device phase's result, marks the partition done and returns the rest of its reservation; by
then its GPU worker may be proving the next partition -- the tracker's guard keeps the worker's
state right."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cuzkd.bundled import prover
from cuzkd.bundled.budget import MemoryBudget
from cuzkd.bundled.jobbook import JobBook
from cuzkd.bundled.jobs import INJECTED_FAILURE, Job
from cuzkd.bundled.threads import run_in
from cuzkd.status.tracker import StatusTracker


class Finalizers:
    """Finalizes the partitions the GPU workers proved."""

    def __init__(self, pool: ThreadPoolExecutor, tracker: StatusTracker, budget: MemoryBudget,
                 book: JobBook, *, clock: Callable[[], float], publish: Callable[[], None],
                 spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        """``spawn`` runs a partition's task."""
        self._pool = pool
        self._tracker = tracker
        self._budget = budget
        self._book = book
        self._clock = clock
        self._publish = publish
        self._spawn = spawn
        self._active = 0

    @property
    def in_flight(self) -> int:
        """Partitions being finalized."""
        return self._active

    def start(self, job: Job, index: int, worker_id: int, result: prover.DeviceResult,
              started: float) -> None:
        """Finalize a partition whose device phase ``worker_id`` began at ``started``."""
        self._spawn(self._finalize(job, index, worker_id, result, started))

    async def _finalize(self, job: Job, index: int, worker_id: int,
                        result: prover.DeviceResult, started: float) -> None:
        self._active += 1
        self._publish()
        try:
            proof = await run_in(self._pool, prover.finalize, result)
        except Exception as exc:
            self._book.partition_failed(job, index, f"finalization failed: {exc!r}")
            return
        finally:
            self._active -= 1
        if job.doomed and job.error is None:
            self._book.partition_failed(job, index, INJECTED_FAILURE)
            return
        ended = self._clock()
        job.gpu_secs[index] = ended - started
        job.gpu_span.cover(started, ended)
        job.proofs[index] = proof
        job.verified[index] = prover.verify(proof)
        self._tracker.partition_gpu_end(job.job_id, index, worker_id)
        self._budget.release((job.job_id, index))
        self._book.partition_ended(job)
