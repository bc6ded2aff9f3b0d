"""The bundled engine's intake: queued jobs taken by priority (cuzk's: a WinningPoSt, CRITICAL,
is due within its epoch), first-come first-served within one, and their partitions admitted one
by one, each only once :class:`~cuzkd.bundled.budget.MemoryBudget` has granted its reservation.
The budget, not a thread count, bounds how many partitions synthesize or wait for a GPU at
once -- as in cuzk."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import structlog

from cuzkd.bundled import prover
from cuzkd.bundled.backend import Backend
from cuzkd.bundled.budget import MemoryBudget
from cuzkd.bundled.jobbook import JobBook
from cuzkd.bundled.jobs import Job, JobState
from cuzkd.errors import BudgetExceededError

_log = structlog.get_logger("cuzkd.engine")


class Scheduler:
    """The queue of accepted jobs and the one task that admits their partitions."""

    def __init__(self, backend: Backend, budget: MemoryBudget, book: JobBook, *,
                 clock: Callable[[], float], publish: Callable[[], None],
                 synthesize: Callable[[Job, int], None]) -> None:
        """``synthesize``: starts an admitted partition's synthesis."""
        self._backend = backend
        self._budget = budget
        self._book = book
        self._clock = clock
        self._publish = publish
        self._synthesize = synthesize
        #: (-priority, submission number, job): the highest priority first, then the oldest
        self._queue: asyncio.PriorityQueue[tuple[int, int, Job]] = asyncio.PriorityQueue()
        self._numbers = itertools.count(1)
        self._admitting: Job | None = None
        #: (device, log2 size) of the NTT plans whose tables the budget holds
        self._tables_reserved: set[tuple[int, int]] = set()
        self._task: asyncio.Task[None] | None = None

    @property
    def queue_depth(self) -> int:
        """Jobs waiting for admission, the one being admitted included."""
        return self._queue.qsize() + (1 if self._admitting is not None else 0)

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self._schedule(), name="scheduler")
        return self._task

    def enqueue(self, job: Job) -> None:
        """Queue a new job, or fail it at once when one partition of it exceeds the budget."""
        synth_bytes, rest_bytes = self._partition_bytes(job.size_log2)
        try:
            self._budget.check(synth_bytes,
                               rest_bytes + self._missing_table_bytes(job.size_log2))
        except BudgetExceededError as exc:
            self._book.fail_unadmitted(job, f"size_log2 {job.size_log2}: {exc}")
        else:
            self._queue.put_nowait((-job.priority, next(self._numbers), job))

    def abandon(self) -> None:
        """Stop admitting for good and forget the queued jobs (their owner fails them)."""
        if self._task is not None:
            self._task.cancel()
        while not self._queue.empty():
            self._queue.get_nowait()
        self._admitting = None

    async def _schedule(self) -> None:
        while True:
            _, _, job = await self._queue.get()
            self._admitting = job
            self._publish()
            synth_bytes, rest_bytes = self._partition_bytes(job.size_log2)
            try:
                await self._reserve_tables(job.size_log2)
                for index in range(job.partitions):
                    if job.failed:
                        break
                    await self._budget.acquire((job.job_id, index), synth_bytes, rest_bytes)
                    if job.failed:  # a partition failed while we waited: hand the grant back
                        self._budget.release((job.job_id, index))
                        break
                    self._admit(job, index)
            except BudgetExceededError as exc:  # cached tables left too little for it
                if job.error is None:
                    job.error = f"size_log2 {job.size_log2}: {exc}"
            if job.error is not None:  # a partition failed: the rest never start
                self._book.fail_unadmitted(job, job.error)
            self._admitting = None
            self._publish()

    def _partition_bytes(self, log_n: int) -> tuple[int, int]:
        return prover.partition_bytes(log_n, self._backend.computes_on_host)

    def _missing_tables(self, log_n: int) -> list[tuple[int, int]]:
        """(device, size) of the NTT plans a partition of 2^log_n needs that are not
        reserved yet: sizes n and 2n, on every device (any worker may prove it)."""
        return [(ordinal, size) for ordinal, _ in self._backend.devices
                for size in (log_n, log_n + 1) if (ordinal, size) not in self._tables_reserved]

    def _missing_table_bytes(self, log_n: int) -> int:
        return sum(prover.table_bytes(size, self._backend.computes_on_host)
                   for _, size in self._missing_tables(log_n))

    async def _reserve_tables(self, log_n: int) -> None:
        """Pin the budget for NTT tables before the first partition that builds them is
        admitted: they are cached for the engine's life. Reserved here, in line with the
        partitions, so a GPU worker never waits for memory while holding a device."""
        for ordinal, size in self._missing_tables(log_n):
            await self._budget.acquire(("ntt-tables", ordinal, size), 0,
                                       prover.table_bytes(size, self._backend.computes_on_host),
                                       pinned=True)
            self._tables_reserved.add((ordinal, size))

    def _admit(self, job: Job, index: int) -> None:
        if job.started_at is None:
            job.started_at = self._clock()
            job.state = JobState.RUNNING
            _log.info("job_started", job_id=job.job_id, proof_kind=job.proof_kind,
                      partitions=job.partitions, size_log2=job.size_log2,
                      queued_secs=round(job.started_at - job.submitted_at, 6))
        job.admitted += 1
        self._synthesize(job, index)
