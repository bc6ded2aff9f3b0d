"""The bundled engine's finalizers: one task per proved partition commits and verifies the
device phase's result, marks the partition done and returns the rest of its reservation; by
then its GPU worker may be proving the next partition -- the tracker's guard keeps the worker's
state right."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from cuzkd.bundled import prover
from cuzkd.bundled.jobs import INJECTED_FAILURE, Job
from cuzkd.bundled.partitionwork import PartitionWork
from cuzkd.bundled.threads import run_in


class Finalizers:
    """Finalizes the partitions the GPU workers proved."""

    def __init__(self, pool: ThreadPoolExecutor, work: PartitionWork) -> None:
        self._pool = pool
        self._work = work
        self._active = 0

    @property
    def in_flight(self) -> int:
        """Partitions being finalized."""
        return self._active

    def start(self, job: Job, index: int, worker_id: int, result: prover.DeviceResult,
              started: float) -> None:
        """Finalize a partition whose device phase ``worker_id`` began at ``started``."""
        self._work.spawn(self._finalize(job, index, worker_id, result, started))

    async def _finalize(self, job: Job, index: int, worker_id: int,
                        result: prover.DeviceResult, started: float) -> None:
        self._active += 1
        self._work.publish()
        try:
            proof = await run_in(self._pool, prover.finalize, result)
        except Exception as exc:
            self._work.book.partition_failed(job, index, f"finalization failed: {exc!r}")
            return
        finally:
            self._active -= 1
        if job.doomed and job.error is None:
            self._work.book.partition_failed(job, index, INJECTED_FAILURE)
            return
        ended = self._work.clock()
        job.gpu_secs[index] = ended - started
        job.gpu_span.cover(started, ended)
        job.proofs[index] = proof
        job.verified[index] = prover.verify(proof)
        self._work.tracker.partition_gpu_end(job.job_id, index, worker_id)
        self._work.budget.release((job.job_id, index))
        self._work.book.partition_ended(job)
