"""The bundled engine's GPU workers: ``workers_per_gpu`` per device. A worker takes a witness,
uploads it, runs the device part under the device's lock, hands the result to a finalizer and
at once takes the next witness (split proving, as in cuzk)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from cuzkd.bundled import prover
from cuzkd.bundled.backend import Backend
from cuzkd.bundled.finalizers import Finalizers
from cuzkd.bundled.jobbook import JobBook
from cuzkd.bundled.plans import PlanCache
from cuzkd.bundled.synthesis import Synthesized
from cuzkd.bundled.threads import run_in
from cuzkd.status.tracker import StatusTracker

_T = TypeVar("_T")


def worker_slots(backend: Backend, workers_per_gpu: int) -> list[tuple[int, int]]:
    """(worker id, device ordinal) of every GPU worker: ``workers_per_gpu`` per device."""
    ordinals = [ordinal for ordinal, _ in backend.devices for _ in range(workers_per_gpu)]
    return list(enumerate(ordinals))


class GpuWorkers:
    """The workers, as (worker id, device ordinal) in :attr:`workers`, and the device phase
    each runs."""

    def __init__(self, workers: list[tuple[int, int]], backend: Backend, pool: ThreadPoolExecutor,
                 plans: PlanCache, tracker: StatusTracker, book: JobBook,
                 finalizers: Finalizers, *, clock: Callable[[], float],
                 publish: Callable[[], None], slowdown: float) -> None:
        """``workers``: their :func:`worker_slots`; ``slowdown``: ProverConfig.test_slowdown."""
        self.workers = workers
        self._slowdown = slowdown
        self._backend = backend
        self._pool = pool
        self._plans = plans
        self._tracker = tracker
        self._book = book
        self._finalizers = finalizers
        self._clock = clock
        self._publish = publish
        self._device_locks = {ordinal: asyncio.Lock() for ordinal, _ in backend.devices}
        self._proving = 0

    @property
    def in_flight(self) -> int:
        """Partitions in their device phase."""
        return self._proving

    def start(self, witnesses: asyncio.Queue[Synthesized]) -> list[asyncio.Task[None]]:
        """Start every worker on the queue of synthesized partitions."""
        return [asyncio.create_task(self._work(worker_id, ordinal, witnesses),
                                    name=f"gpu-worker-{worker_id}")
                for worker_id, ordinal in self.workers]

    async def _work(self, worker_id: int, ordinal: int,
                    witnesses: asyncio.Queue[Synthesized]) -> None:
        while True:
            await self._prove_next(worker_id, ordinal, witnesses)

    async def _prove_next(self, worker_id: int, ordinal: int,
                          witnesses: asyncio.Queue[Synthesized]) -> None:
        """One partition's device phase. A function of its own so that the witness, the
        uploaded copy and the result die with it: kept alive by an idle worker's loop they
        would be memory the budget no longer counts."""
        job, index, witness = await witnesses.get()
        self._tracker.partition_gpu_start(job.job_id, index, worker_id)
        self._proving += 1
        self._publish()
        started = self._clock()
        try:
            small, large = self._plans.for_partition(ordinal, job.size_log2, job.proof_kind,
                                                     self._clock())
            abc = await self._on_device(ordinal, small.xp.asarray, witness.abc)
            async with self._device_locks[ordinal]:
                result = await self._on_device(ordinal, prover.prove_device, witness, abc,
                                               small, large, self._backend.to_host)
            if self._slowdown > 1:  # test-only: a slower build, the worker held
                await asyncio.sleep((self._slowdown - 1) * (self._clock() - started))
        except Exception as exc:
            self._book.partition_failed(job, index, f"GPU phase failed: {exc!r}")
            return
        finally:
            self._proving -= 1
        self._finalizers.start(job, index, worker_id, result, started)

    async def _on_device(self, ordinal: int, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on a device thread, with ``ordinal`` the current device."""
        return await run_in(self._pool, self._in_device_context, ordinal, fn, *args)

    def _in_device_context(self, ordinal: int, fn: Callable[..., _T], *args: Any) -> _T:
        with self._backend.device(ordinal):
            return fn(*args)
