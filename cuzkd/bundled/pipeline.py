"""cuzk's pipeline structure on the event loop: intake → budgeted synthesis → GPU workers →
finalizers.

* **Intake/scheduler**: one task takes jobs by priority (cuzk's: a WinningPoSt, CRITICAL, is
  due within its epoch), first-come first-served within one, and admits their partitions one
  by one, each only once :class:`~cuzkd.bundled.budget.MemoryBudget` has
  granted its reservation. The budget, not a thread count, bounds how many partitions
  synthesize or wait for a GPU at once -- as in cuzk.
* **Synthesis**: one task per admitted partition runs :func:`~cuzkd.bundled.prover.synthesize`
  in a thread pool (NumPy releases the GIL, the loop stays responsive), returns the synthesis
  part of the reservation and queues the witness.
* **GPU workers**: ``workers_per_gpu`` per device. A worker takes a witness, uploads it, runs the
  device part under the device's lock, hands the result to a finalizer task and immediately
  takes the next witness (split proving). The finalizer commits, verifies, marks the partition
  done and returns the rest of the reservation; by then the worker may be proving the next
  partition -- the tracker's guard keeps the worker's state right.

Every task is owned: long-lived ones in ``_services``, per-partition ones in ``_partition_tasks``,
the drain in ``_drain``; :meth:`Engine.drain` finishes every accepted job (queued ones too),
:meth:`Engine.close` cancels and awaits everything and shuts the thread pools down.

Draining (docs/engine.md): intake closes, and every job already accepted is finished -- a
client that got 202 must get its proof -- until the drain's deadline or an explicit
:meth:`Engine.cut_drain`; what is still open then ends ``failed`` with :data:`DRAIN_TIMEOUT`,
so no accepted job ever vanishes without a state.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import time
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import structlog

from cuzkd.bundled import prover
from cuzkd.bundled.backend import Backend
from cuzkd.bundled.budget import MemoryBudget
from cuzkd.bundled.ntt import NttPlan
from cuzkd.bundled.settings import MAX_SIZE_LOG2, MIN_SIZE_LOG2, PARTITIONS, ProverConfig
from cuzkd.errors import BudgetExceededError, EngineDrainingError, JobRequestError
from cuzkd.priority import Priority
from cuzkd.status.document import Allocation
from cuzkd.status.tracker import StatusTracker

_log = structlog.get_logger("cuzkd.engine")

JobState = Literal["queued", "running", "done", "failed"]
MAX_PARTITIONS = 1024
#: The error of a job still open when a drain ended (its deadline, or a stop signal).
DRAIN_TIMEOUT = "drain timeout"
#: The error of the partition a test-only failure rate fails (ProverConfig.test_failure_rate).
INJECTED_FAILURE = "injected failure (test-only failure rate)"
_T = TypeVar("_T")


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
    """One proof job as the API reports it. Times are ``time.monotonic`` values."""

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
    state: JobState = "queued"
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


@dataclass
class _PlanUse:
    """NTT tables of one size on one device, and when each proof kind last used them."""

    plan: NttPlan
    last_used: dict[str, float] = field(default_factory=dict)


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
        self.jobs: dict[str, Job] = {}
        #: request_id -> the latest job submitted under it, retained as long as ``jobs`` is
        self.requests: dict[str, Job] = {}
        self._clock = clock
        self._retain_jobs = retain_jobs
        self._finished: deque[str] = deque()
        self._ids = itertools.count(1)
        self._injection = itertools.count(1)
        self._id_salt = f"{os.getpid()}-{secrets.token_hex(3)}"
        #: (-priority, submission number, job): the highest priority first, then the oldest
        self._intake: asyncio.PriorityQueue[tuple[int, int, Job]] = asyncio.PriorityQueue()
        self._admitting: Job | None = None
        self._synth_done: asyncio.Queue[tuple[Job, int, prover.Witness]] = asyncio.Queue()
        self._device_locks = {ordinal: asyncio.Lock() for ordinal, _ in backend.devices}
        self._plans: dict[tuple[int, int], _PlanUse] = {}
        #: (device, log2 size) of the NTT plans whose tables the budget holds
        self._tables_reserved: set[tuple[int, int]] = set()
        workers = [ordinal for ordinal, _ in backend.devices
                   for _ in range(config.workers_per_gpu)]
        self.workers: list[tuple[int, int]] = list(enumerate(workers))
        self._synth_pool = ThreadPoolExecutor(config.synthesis_threads, "synth")
        self._device_pool = ThreadPoolExecutor(len(self.workers), "device")
        self._final_pool = ThreadPoolExecutor(2, "finalize")
        self._services: list[asyncio.Task[None]] = []
        self._scheduler: asyncio.Task[None] | None = None
        self._open_jobs = 0
        #: set while no accepted job is open (what a drain waits for)
        self._no_open_jobs = asyncio.Event()
        self._no_open_jobs.set()
        self._drain: asyncio.Task[bool] | None = None
        self._drain_requested = asyncio.Event()
        self._drain_cut = asyncio.Event()
        self._drain_deadline: float | None = None
        self._partition_tasks: set[asyncio.Task[None]] = set()
        self._synth_active = 0
        self._provers = 0
        self._finalizing = 0

    def now(self) -> float:
        """The engine's clock (job times in :class:`Job` are on it)."""
        return self._clock()

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.tracker.set_backend(self.backend.name)
        self.tracker.register_workers(self.workers)
        self._scheduler = asyncio.create_task(self._schedule(), name="scheduler")
        self._services.append(self._scheduler)
        for worker_id, ordinal in self.workers:
            self._services.append(asyncio.create_task(
                self._gpu_worker(worker_id, ordinal), name=f"gpu-worker-{worker_id}"))
        self._publish()

    @property
    def draining(self) -> bool:
        return self._drain is not None

    @property
    def open_jobs(self) -> int:
        """Accepted jobs not finished yet."""
        return self._open_jobs

    def begin_drain(self, timeout_secs: float, trigger: str) -> bool:
        """Close intake and finish every accepted job within ``timeout_secs`` (see the module
        docstring); False when a drain was already under way (its deadline stands).
        ``trigger`` (a signal name, ``http``) is logged."""
        if self._drain is not None:
            return False
        _log.info("engine_draining", trigger=trigger, timeout_secs=timeout_secs,
                  open_jobs=self._open_jobs)
        self.accepting = False
        self._drain_deadline = self._clock() + timeout_secs
        self.tracker.set_draining(True)
        self._drain = asyncio.create_task(self._drain_jobs(timeout_secs), name="drain")
        self._drain_requested.set()
        self._publish()
        return True

    def cut_drain(self) -> None:
        """End the drain now: what is still open fails with :data:`DRAIN_TIMEOUT`."""
        self._drain_cut.set()

    def drain_remaining_secs(self) -> float | None:
        """Seconds left until the drain's deadline; None when not draining."""
        if self._drain_deadline is None:
            return None
        return max(0.0, self._drain_deadline - self._clock())

    async def drained(self) -> bool:
        """Wait for a drain to be begun and to end; True when every accepted job finished."""
        await self._drain_requested.wait()
        assert self._drain is not None
        return await asyncio.shield(self._drain)

    async def drain(self, timeout_secs: float, trigger: str = "call") -> bool:
        """:meth:`begin_drain` and :meth:`drained` in one."""
        self.begin_drain(timeout_secs, trigger)
        return await self.drained()

    async def _drain_jobs(self, timeout_secs: float) -> bool:
        idle = asyncio.create_task(self._no_open_jobs.wait())
        cut = asyncio.create_task(self._drain_cut.wait())
        try:
            await asyncio.wait((idle, cut), timeout=timeout_secs,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (idle, cut):
                task.cancel()
        if self._open_jobs == 0:
            return True
        self._fail_open_jobs(DRAIN_TIMEOUT)
        return False

    def _fail_open_jobs(self, error: str) -> None:
        """Fail every accepted job that is not finished, partitions in flight included (the
        engine is about to exit: they would never finish)."""
        if self._scheduler is not None:
            self._scheduler.cancel()
        while not self._intake.empty():
            self._intake.get_nowait()
        self._admitting = None
        for job in list(self.jobs.values()):
            if job.finished_at is not None:
                continue
            if job.error is None:
                job.error = error
            for index, proof in enumerate(job.proofs):
                if proof is None:
                    self.tracker.partition_failed(job.job_id, index)
            job.admitted = job.partitions
            job.remaining = 0
            self._finish_if_done(job)
        self._publish()

    async def close(self) -> None:
        """Cancel and await every task, then shut the thread pools down."""
        self.accepting = False
        tasks = [*self._services, *self._partition_tasks,
                 *([self._drain] if self._drain is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._services.clear()
        for pool in (self._synth_pool, self._device_pool, self._final_pool):
            await asyncio.to_thread(pool.shutdown, True, cancel_futures=True)

    # --- intake ---------------------------------------------------------------------------

    def submit(self, proof_kind: str, partitions: int | None = None,
               size_log2: int | None = None, request_id: str = "",
               priority: Priority = Priority.NORMAL) -> Job:
        """Accept a job (queued, or failed at once when a partition exceeds the budget);
        ``request_id``: the client's id for it (see :attr:`Job.request_id`)."""
        if not self.accepting:
            raise EngineDrainingError("engine is shutting down and accepts no new jobs")
        if proof_kind not in PARTITIONS:
            raise JobRequestError(
                f"unknown proof_kind {proof_kind!r}; known: {sorted(PARTITIONS)}")
        count = PARTITIONS[proof_kind] if partitions is None else partitions
        if not 1 <= count <= MAX_PARTITIONS:
            raise JobRequestError(f"partitions must be between 1 and {MAX_PARTITIONS}")
        log_n = self.config.size_log2(proof_kind) if size_log2 is None else size_log2
        if not MIN_SIZE_LOG2 <= log_n <= MAX_SIZE_LOG2:
            raise JobRequestError(
                f"size_log2 must be between {MIN_SIZE_LOG2} and {MAX_SIZE_LOG2}")
        number = next(self._ids)
        job_id = f"ref-{proof_kind}-{self._id_salt}-{number}"
        job = Job(job_id=job_id, proof_kind=proof_kind, partitions=count, size_log2=log_n,
                  submitted_at=self._clock(), request_id=request_id, priority=priority)
        self.jobs[job_id] = job
        self.requests[job.request_id] = job
        self.tracker.register_job(job_id, proof_kind, count)
        self._open_jobs += 1
        self._no_open_jobs.clear()
        job.doomed = injected_failure(next(self._injection), self.config.test_failure_rate)
        synth_bytes, rest_bytes = self._partition_bytes(log_n)
        try:
            self.budget.check(synth_bytes, rest_bytes + self._missing_table_bytes(log_n))
        except BudgetExceededError as exc:
            self._fail_unadmitted(job, f"size_log2 {log_n}: {exc}")
        else:
            self._intake.put_nowait((-priority, number, job))
        self._publish()
        return job

    async def _schedule(self) -> None:
        while True:
            _, _, job = await self._intake.get()
            self._admitting = job
            self._publish()
            synth_bytes, rest_bytes = self._partition_bytes(job.size_log2)
            try:
                await self._reserve_tables(job.size_log2)
                for index in range(job.partitions):
                    if job.failed:
                        break
                    await self.budget.acquire((job.job_id, index), synth_bytes, rest_bytes)
                    if job.failed:  # a partition failed while we waited: hand the grant back
                        self.budget.release((job.job_id, index))
                        break
                    self._admit(job, index)
            except BudgetExceededError as exc:  # cached tables left too little for it
                if job.error is None:
                    job.error = f"size_log2 {job.size_log2}: {exc}"
            if job.error is not None:  # a partition failed: the rest never start
                self._fail_unadmitted(job, job.error)
            self._admitting = None
            self._publish()

    def _partition_bytes(self, log_n: int) -> tuple[int, int]:
        return prover.partition_bytes(log_n, self.backend.computes_on_host)

    def _missing_tables(self, log_n: int) -> list[tuple[int, int]]:
        """(device, size) of the NTT plans a partition of 2^log_n needs that are not
        reserved yet: sizes n and 2n, on every device (any worker may prove it)."""
        return [(ordinal, size) for ordinal, _ in self.backend.devices
                for size in (log_n, log_n + 1) if (ordinal, size) not in self._tables_reserved]

    def _missing_table_bytes(self, log_n: int) -> int:
        return sum(prover.table_bytes(size, self.backend.computes_on_host)
                   for _, size in self._missing_tables(log_n))

    async def _reserve_tables(self, log_n: int) -> None:
        """Pin the budget for NTT tables before the first partition that builds them is
        admitted: they are cached for the engine's life. Reserved by the scheduler, in line
        with the partitions, so a GPU worker never waits for memory while holding a device."""
        for ordinal, size in self._missing_tables(log_n):
            await self.budget.acquire(("ntt-tables", ordinal, size), 0,
                                      prover.table_bytes(size, self.backend.computes_on_host),
                                      pinned=True)
            self._tables_reserved.add((ordinal, size))

    def _admit(self, job: Job, index: int) -> None:
        if job.started_at is None:
            job.started_at = self._clock()
            job.state = "running"
            _log.info("job_started", job_id=job.job_id, proof_kind=job.proof_kind,
                      partitions=job.partitions, size_log2=job.size_log2,
                      queued_secs=round(job.started_at - job.submitted_at, 6))
        job.admitted += 1
        self._spawn(self._synthesize(job, index))

    # --- partition phases -----------------------------------------------------------------

    async def _synthesize(self, job: Job, index: int) -> None:
        self._synth_active += 1
        self._publish()
        try:
            witness, started, ended = await self._run(
                self._synth_pool, self._synthesize_in_thread, job, index)
        except Exception as exc:
            self._partition_failed(job, index, f"synthesis failed: {exc!r}")
            return
        finally:
            self._synth_active -= 1
        job.synth_secs[index] = ended - started
        job.synth_span.cover(started, ended)
        self.budget.release_synth((job.job_id, index))
        self.tracker.partition_synth_end(job.job_id, index)
        self._synth_done.put_nowait((job, index, witness))
        self._publish()

    def _synthesize_in_thread(self, job: Job,
                              index: int) -> tuple[prover.Witness, float, float]:
        """Runs on a synthesis thread: the partition is ``synthesizing`` only from the moment a
        thread works on it (admitted partitions queued for a thread stay ``pending``).
        Returns the witness and when its synthesis started and ended."""
        self.tracker.partition_synth_start(job.job_id, index)
        started = self._clock()
        witness = prover.synthesize(job.job_id, index, job.size_log2,
                                    self.config.synthesis_rounds)
        return witness, started, self._clock()

    async def _gpu_worker(self, worker_id: int, ordinal: int) -> None:
        while True:
            await self._prove_next(worker_id, ordinal)

    async def _prove_next(self, worker_id: int, ordinal: int) -> None:
        """One partition's device phase. A function of its own so that the witness, the
        uploaded copy and the result die with it: kept alive by an idle worker's loop they
        would be memory the budget no longer counts."""
        job, index, witness = await self._synth_done.get()
        self.tracker.partition_gpu_start(job.job_id, index, worker_id)
        self._provers += 1
        self._publish()
        started = self._clock()
        try:
            small, large = self._plans_for(ordinal, job)
            abc = await self._run(self._device_pool, self._on_device, ordinal,
                                  small.xp.asarray, witness.abc)
            async with self._device_locks[ordinal]:
                result = await self._run(
                    self._device_pool, self._on_device, ordinal, prover.prove_device,
                    witness, abc, small, large, self.backend.to_host)
            if self.config.test_slowdown > 1:  # test-only: a slower build, the worker held
                await asyncio.sleep((self.config.test_slowdown - 1) * (self._clock() - started))
        except Exception as exc:
            self._partition_failed(job, index, f"GPU phase failed: {exc!r}")
            return
        finally:
            self._provers -= 1
        self._spawn(self._finalize(job, index, worker_id, result, started))

    async def _finalize(self, job: Job, index: int, worker_id: int,
                        result: prover.DeviceResult, started: float) -> None:
        self._finalizing += 1
        self._publish()
        try:
            proof = await self._run(self._final_pool, prover.finalize, result)
        except Exception as exc:
            self._partition_failed(job, index, f"finalization failed: {exc!r}")
            return
        finally:
            self._finalizing -= 1
        if job.doomed and job.error is None:
            self._partition_failed(job, index, INJECTED_FAILURE)
            return
        ended = self._clock()
        job.gpu_secs[index] = ended - started
        job.gpu_span.cover(started, ended)
        job.proofs[index] = proof
        job.verified[index] = prover.verify(proof)
        self.tracker.partition_gpu_end(job.job_id, index, worker_id)
        self.budget.release((job.job_id, index))
        self._partition_terminal(job)

    # --- bookkeeping ----------------------------------------------------------------------

    def _partition_failed(self, job: Job, index: int, error: str) -> None:
        self.tracker.partition_failed(job.job_id, index)
        self.budget.release((job.job_id, index))
        if job.error is None:
            job.error = f"partition {index}: {error}"
        self._partition_terminal(job)

    def _fail_unadmitted(self, job: Job, error: str) -> None:
        """Fail the partitions the scheduler has not admitted (none if all were)."""
        if job.admitted == job.partitions:
            return
        if job.error is None:
            job.error = error
        for index in range(job.admitted, job.partitions):
            self.tracker.partition_failed(job.job_id, index)
        job.remaining -= job.partitions - job.admitted
        job.admitted = job.partitions
        self._finish_if_done(job)

    def _partition_terminal(self, job: Job) -> None:
        """An admitted partition is done or failed."""
        job.remaining -= 1
        self._finish_if_done(job)
        self._publish()

    def _finish_if_done(self, job: Job) -> None:
        if job.remaining > 0 or job.finished_at is not None:
            return
        job.finished_at = self._clock()
        self._open_jobs -= 1
        if self._open_jobs == 0:
            self._no_open_jobs.set()
        job.state = "failed" if job.failed else "done"
        self.tracker.job_completed(job.job_id, job.proof_kind, not job.failed)
        wall = round(job.finished_at - job.submitted_at, 6)
        if job.failed:
            _log.warning("job_failed", job_id=job.job_id, proof_kind=job.proof_kind,
                         error=job.error, wall_secs=wall)
        else:
            _log.info("job_finished", job_id=job.job_id, proof_kind=job.proof_kind,
                      partitions=job.partitions, verified=all(job.verified), wall_secs=wall)
        job.finished.set()
        self._finished.append(job.job_id)
        while len(self._finished) > self._retain_jobs:
            dropped = self.jobs.pop(self._finished.popleft(), None)
            if dropped is not None and self.requests.get(dropped.request_id) is dropped:
                del self.requests[dropped.request_id]

    def _publish(self) -> None:
        """Push the gauges cuzk reports (buffers, queue depth) to the tracker."""
        self.tracker.set_queue_depth(
            self._intake.qsize() + (1 if self._admitting is not None else 0))
        self.tracker.set_buffers(
            synth_in_flight=self._synth_active,
            provers_in_flight=self._provers,
            aux_in_flight=self._finalizing,
            shells_in_flight=self._synth_done.qsize(),
            pending_handles=self._open_jobs,
        )

    def refresh_status(self) -> None:
        """Update what is sampled rather than evented: device memory and NTT tables."""
        self.tracker.set_gpu_devices(self.backend.memory())
        now = self._clock()
        srs: list[Allocation] = []
        pce: list[Allocation] = []
        for (ordinal, log_n), use in sorted(self._plans.items()):
            for kind, last in sorted(use.last_used.items()):
                circuit = f"{kind}-2^{log_n}@{ordinal}"
                ago = max(0.0, now - last)
                srs.append(Allocation(circuit_id=circuit, bytes=use.plan.table_bytes,
                                      last_used_secs_ago=ago, evictable=False))
                pce.append(Allocation(circuit_id=circuit, bytes=use.plan.coset_bytes,
                                      last_used_secs_ago=ago, evictable=False))
        self.tracker.set_allocations(srs=srs, pce=pce)

    # --- helpers --------------------------------------------------------------------------

    def _plans_for(self, ordinal: int, job: Job) -> tuple[NttPlan, NttPlan]:
        """Plans of size n and 2n on ``ordinal`` (tables are built lazily, on the device)."""
        plans = []
        for log_n in (job.size_log2, job.size_log2 + 1):
            use = self._plans.get((ordinal, log_n))
            if use is None:
                use = self._plans[(ordinal, log_n)] = _PlanUse(NttPlan(log_n, self.backend.xp))
            use.last_used[job.proof_kind] = self._clock()
            plans.append(use.plan)
        return plans[0], plans[1]

    def _on_device(self, ordinal: int, fn: Callable[..., _T], *args: Any) -> _T:
        with self.backend.device(ordinal):
            return fn(*args)

    async def _run(self, pool: ThreadPoolExecutor, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._partition_tasks.add(task)
        task.add_done_callback(self._partition_tasks.discard)


def injected_failure(number: int, rate: float) -> bool:
    """Whether job ``number`` (1, 2, ...) is one a failure ``rate`` fails: deterministic, so
    exactly ``floor(n * rate)`` of the first n jobs fail (rate 1/3: every third)."""
    return int(number * rate + 1e-9) > int((number - 1) * rate + 1e-9)
