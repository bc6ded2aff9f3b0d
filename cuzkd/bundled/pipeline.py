"""cuzk's pipeline structure on the event loop, composed of one part per job:

* :class:`~cuzkd.bundled.jobbook.JobBook`: the accepted jobs, counted down and finished;
* :class:`~cuzkd.bundled.scheduler.Scheduler`: intake by priority, partitions admitted under
  the memory budget;
* :class:`~cuzkd.bundled.synthesis.Synthesis`: admitted partitions synthesized on threads;
* :class:`~cuzkd.bundled.gpuworkers.GpuWorkers`: the device phase, ``workers_per_gpu`` per
  device;
* :class:`~cuzkd.bundled.finalizers.Finalizers`: commit, verify, return the reservation;
* :class:`~cuzkd.bundled.drain.Drain`: intake closed, the accepted jobs finished or failed.

Every task is owned: long-lived ones (scheduler, workers) in ``_services``, per-partition ones in
``_partition_tasks``, the drain's by the drain; :meth:`Engine.close` cancels and awaits them all
and shuts the thread pools down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from cuzkd.bundled.backend import Backend
from cuzkd.bundled.budget import MemoryBudget
from cuzkd.bundled.drain import Drain
from cuzkd.bundled.finalizers import Finalizers
from cuzkd.bundled.gpuworkers import GpuWorkers, worker_slots
from cuzkd.bundled.jobbook import JobBook
from cuzkd.bundled.jobs import Job, checked_request
from cuzkd.bundled.partitionwork import PartitionWork
from cuzkd.bundled.plans import PlanCache
from cuzkd.bundled.scheduler import Scheduler
from cuzkd.bundled.settings import ProverConfig
from cuzkd.bundled.synthesis import Synthesis
from cuzkd.bundled.threads import ThreadPools
from cuzkd.errors import EngineDrainingError
from cuzkd.priority import Priority
from cuzkd.status.tracker import StatusTracker

_log = structlog.get_logger("cuzkd.engine")


class Engine:
    """The reference engine's pipeline. Create, :meth:`start`, :meth:`submit` jobs,
    :meth:`drain`, :meth:`close` -- all on one event loop."""

    def __init__(self, config: ProverConfig, backend: Backend, tracker: StatusTracker,
                 budget: MemoryBudget, *, clock: Callable[[], float] = time.monotonic,
                 retain_jobs: int = 1000) -> None:
        self.config = config
        self.backend = backend
        self.tracker = tracker
        self.budget = budget
        self.accepting = True
        self._clock = clock
        self._book = JobBook(tracker, budget, clock=clock, publish=self._publish,
                             retain_jobs=retain_jobs)
        workers = worker_slots(backend, config.workers_per_gpu)
        self._pools = ThreadPools(config.synthesis_threads, len(workers))
        self._plans = PlanCache(backend.xp)
        self._partition_tasks: set[asyncio.Task[None]] = set()
        work = PartitionWork(tracker, budget, self._book, clock=clock, publish=self._publish,
                             spawn=self._spawn)
        self._synthesis = Synthesis(config.synthesis_rounds, self._pools.synthesis, work)
        self._scheduler = Scheduler(backend, budget, self._book, clock=clock,
                                    publish=self._publish, synthesize=self._synthesis.start)
        self._finalizers = Finalizers(self._pools.finalize, work)
        self._gpus = GpuWorkers(workers, backend, self._pools.device, self._plans, tracker,
                                self._book, self._finalizers, clock=clock,
                                publish=self._publish, slowdown=config.test_slowdown)
        self._drain = Drain(self._book, clock=clock, expire=self._fail_open_jobs)
        self._services: list[asyncio.Task[None]] = []

    @property
    def jobs(self) -> dict[str, Job]:
        """Every accepted job still retained, by job id."""
        return self._book.jobs

    @property
    def requests(self) -> dict[str, Job]:
        """request_id -> the latest job submitted under it, retained as long as ``jobs`` is."""
        return self._book.requests

    @property
    def workers(self) -> list[tuple[int, int]]:
        """(worker id, device ordinal) of every GPU worker."""
        return self._gpus.workers

    def now(self) -> float:
        """The engine's clock (job times in :class:`~cuzkd.bundled.jobs.Job` are on it)."""
        return self._clock()

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.tracker.set_backend(self.backend.name)
        self.tracker.register_workers(self.workers)
        self._services.append(self._scheduler.start())
        self._services.extend(self._gpus.start(self._synthesis.witnesses))
        self._publish()

    @property
    def draining(self) -> bool:
        return self._drain.begun

    @property
    def open_jobs(self) -> int:
        """Accepted jobs not finished yet."""
        return self._book.open_jobs

    def begin_drain(self, timeout_secs: float, trigger: str) -> bool:
        """Close intake and finish every accepted job within ``timeout_secs`` (see
        :mod:`cuzkd.bundled.drain`); False when a drain was already under way (its deadline
        stands). ``trigger`` (a signal name, ``http``) is logged."""
        if self._drain.begun:
            return False
        _log.info("engine_draining", trigger=trigger, timeout_secs=timeout_secs,
                  open_jobs=self._book.open_jobs)
        self.accepting = False
        self.tracker.set_draining(True)
        self._drain.begin(timeout_secs)
        self._publish()
        return True

    def cut_drain(self) -> None:
        """End the drain now: what is still open fails with
        :data:`~cuzkd.bundled.drain.DRAIN_TIMEOUT`."""
        self._drain.cut()

    def drain_remaining_secs(self) -> float | None:
        """Seconds left until the drain's deadline; None when not draining."""
        return self._drain.remaining_secs()

    async def drained(self) -> bool:
        """Wait for a drain to be begun and to end; True when every accepted job finished."""
        return await self._drain.ended()

    async def drain(self, timeout_secs: float, trigger: str = "call") -> bool:
        """:meth:`begin_drain` and :meth:`drained` in one."""
        self.begin_drain(timeout_secs, trigger)
        return await self.drained()

    def _fail_open_jobs(self, error: str) -> None:
        """Stop admitting and fail every accepted job that is not finished (the engine is
        about to exit)."""
        self._scheduler.abandon()
        self._book.fail_open(error)
        self._publish()

    async def close(self) -> None:
        """Cancel and await every task, then shut the thread pools down."""
        self.accepting = False
        drain = self._drain.task
        tasks = [*self._services, *self._partition_tasks, *([drain] if drain is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._services.clear()
        await self._pools.shutdown()

    # --- intake ---------------------------------------------------------------------------

    def submit(self, proof_kind: str, partitions: int | None = None,
               size_log2: int | None = None, request_id: str = "",
               priority: Priority = Priority.NORMAL) -> Job:
        """Accept a job (queued, or failed at once when a partition exceeds the budget);
        ``request_id``: the client's id for it (see :attr:`Job.request_id`)."""
        if not self.accepting:
            raise EngineDrainingError("engine is shutting down and accepts no new jobs")
        count, log_n = checked_request(self.config, proof_kind, partitions, size_log2)
        job = self._book.accept(proof_kind, count, log_n, request_id, priority,
                                self.config.test_failure_rate)
        self._scheduler.enqueue(job)
        self._publish()
        return job

    # --- status ---------------------------------------------------------------------------

    def _publish(self) -> None:
        """Push the gauges cuzk reports (buffers, queue depth) to the tracker."""
        self.tracker.set_queue_depth(self._scheduler.queue_depth)
        self.tracker.set_buffers(
            synth_in_flight=self._synthesis.in_flight,
            provers_in_flight=self._gpus.in_flight,
            aux_in_flight=self._finalizers.in_flight,
            shells_in_flight=self._synthesis.witnesses.qsize(),
            pending_handles=self._book.open_jobs,
        )

    def refresh_status(self) -> None:
        """Update what is sampled rather than evented: device memory and NTT tables."""
        self.tracker.set_gpu_devices(self.backend.memory())
        srs, pce = self._plans.allocations(self._clock())
        self.tracker.set_allocations(srs=srs, pce=pce)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a partition's task, owned until it ends."""
        task = asyncio.create_task(coro)
        self._partition_tasks.add(task)
        task.add_done_callback(self._partition_tasks.discard)
