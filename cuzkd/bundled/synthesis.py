"""The bundled engine's synthesis phase: one task per admitted partition runs
:func:`~cuzkd.bundled.prover.synthesize` on a synthesis thread, returns the synthesis part of
the partition's reservation and queues the witness for the GPU workers."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from cuzkd.bundled import prover
from cuzkd.bundled.jobs import Job
from cuzkd.bundled.partitionwork import PartitionWork
from cuzkd.bundled.threads import run_in

#: A synthesized partition: its job, its index and its witness.
Synthesized = tuple[Job, int, prover.Witness]


class Synthesis:
    """Synthesizes admitted partitions; the witnesses wait in :attr:`witnesses` for a GPU
    worker."""

    def __init__(self, rounds: int, pool: ThreadPoolExecutor, work: PartitionWork) -> None:
        """``rounds``: ProverConfig.synthesis_rounds."""
        self._rounds = rounds
        self._pool = pool
        self._work = work
        self.witnesses: asyncio.Queue[Synthesized] = asyncio.Queue()
        self._active = 0

    @property
    def in_flight(self) -> int:
        """Partitions admitted whose synthesis has not ended."""
        return self._active

    def start(self, job: Job, index: int) -> None:
        """Synthesize an admitted partition."""
        self._work.spawn(self._synthesize(job, index))

    async def _synthesize(self, job: Job, index: int) -> None:
        self._active += 1
        self._work.publish()
        try:
            witness, started, ended = await run_in(self._pool, self._in_thread, job, index)
        except Exception as exc:
            self._work.book.partition_failed(job, index, f"synthesis failed: {exc!r}")
            return
        finally:
            self._active -= 1
        job.synth_secs[index] = ended - started
        job.synth_span.cover(started, ended)
        self._work.budget.release_synth((job.job_id, index))
        self._work.tracker.partition_synth_end(job.job_id, index)
        self.witnesses.put_nowait((job, index, witness))
        self._work.publish()

    def _in_thread(self, job: Job, index: int) -> tuple[prover.Witness, float, float]:
        """Runs on a synthesis thread: the partition is ``synthesizing`` only from the moment a
        thread works on it (admitted partitions queued for a thread stay ``pending``).
        Returns the witness and when its synthesis started and ended."""
        self._work.tracker.partition_synth_start(job.job_id, index)
        started = self._work.clock()
        witness = prover.synthesize(job.job_id, index, job.size_log2, self._rounds)
        return witness, started, self._work.clock()
