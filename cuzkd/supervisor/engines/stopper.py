"""Carrying out one engine's stop sequences, and counting what they drained and threw away.

:mod:`~cuzkd.supervisor.core.stopsequence` decides every step of a stop and
:func:`~cuzkd.supervisor.core.drain.lost_work` what it counts; this is the I/O around them: the
drain request, the status and ``GetStatus`` reads, the door seat's count, the signals. Separate
from the runner because a stop is a long conversation with the engine that runs beside
everything else the runner does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from structlog.typing import FilteringBoundLogger

from cuzkd.config import EngineConfig
from cuzkd.config.schema import DrainMode
from cuzkd.cuzk.reading import QueueReading
from cuzkd.errortext import error_text
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.states import DrainResult, StopReason
from cuzkd.status.client import StatusSource
from cuzkd.supervisor.core.drain import cuzk_idle, door_reading, is_quiet, lost_work
from cuzkd.supervisor.core.lifecycle import Stop
from cuzkd.supervisor.core.stopsequence import (
    DrainOver,
    Finished,
    ReadStatus,
    RequestDrain,
    SendSignal,
    StopSequence,
    WaitUntil,
)
from cuzkd.supervisor.engines.drainrequest import ENGINE_DEADLINE_SLACK, request_drain
from cuzkd.supervisor.engines.seat import DoorSeat
from cuzkd.supervisor.engines.spawnrecord import SpawnRecord

#: Reads an engine's GetStatus queues: (its gRPC address, a timeout) -> the reading.
QueueReader = Callable[[str, float], Coroutine[Any, Any, QueueReading]]

#: Job ids named in one ``engine_jobs_lost`` event: an engine listing thousands of jobs
#: must not make one log line of megabytes (the counts stay exact).
LOGGED_JOB_IDS = 100


class EngineStopper:
    """Runs the stop sequence of one engine's processes; keeps the engine's drain and loss
    counts."""

    def __init__(self, spec: EngineConfig, clock: Callable[[], float], *,
                 status_address: str | None, grpc_address: str | None, seat: DoorSeat | None,
                 queue_reader: QueueReader, log: FilteringBoundLogger,
                 limited: LimitedLog) -> None:
        self._spec = spec
        self._clock = clock
        self._status_address = status_address
        self._grpc_address = grpc_address
        self._seat = seat
        self._read_engine_queues = queue_reader
        self._log = log
        self._limited = limited
        #: reason -> partitions in flight when the supervisor stopped the engine
        self.stop_inflight: Counter[str] = Counter()
        #: proof kind -> jobs the engine held when the supervisor stopped it (thrown away)
        self.jobs_lost: Counter[str] = Counter()
        #: drain result (clean, timeout) -> drains
        self.drains: Counter[str] = Counter()
        #: the last GetStatus of the current stop's drain (None: none read in this stop)
        self._queues: QueueReading | None = None

    async def run(self, stop: Stop, process: SpawnRecord, source: StatusSource | None) -> None:
        """Carry out ``stop`` on ``process`` (nothing once it exited); a failure (a bug) still
        ends in the process's end: its group is SIGKILLed, so the engine never stays
        ``stopping`` with nothing stopping it."""
        if process.exited.is_set():
            return
        try:
            await self._carry_out(stop, process, source)
        except Exception as exc:  # the stop must end whatever went wrong
            self._log.error("engine_stop_failed", error=error_text(exc), exc_info=exc)
            if not process.exited.is_set():
                process.kill()

    async def _carry_out(self, stop: Stop, process: SpawnRecord,
                         source: StatusSource | None) -> None:
        """The stop sequence's steps: drain (at most drain_timeout, less when the stop must end
        ``within`` seconds), the stop signal, SIGKILL of the group after stop_timeout; ``kill``
        skips to SIGKILL (``why``: the lifecycle's word for it, in the kill's log)."""
        spec = self._spec
        self._queues = None
        sequence = StopSequence.begin(
            self._clock(), drain_mode=spec.drain_mode if stop.drain else DrainMode.NONE,
            drain_timeout=spec.drain_timeout, stop_timeout=spec.stop_timeout,
            health_interval=spec.health_interval, kill_reason=stop.why if stop.kill else None,
            within=stop.within)
        if self._seat is not None:  # every stop, drained or not: no new call goes to it
            self._seat.stop_admitting(sequence.deadline_work_window(self._clock(), stop.reason))
        if sequence.draining:
            self._log.info("engine_drain_requested", pid=process.pid, mode=spec.drain_mode,
                           timeout=round(sequence.deadline - sequence.started, 3))
        while True:
            match sequence.step(self._clock(), exited=process.exited.is_set(),
                                killed=process.killed):
                case RequestDrain(by=by):
                    sequence.drain_answered(await self._until(by, self._request_drain(process)))
                case ReadStatus(by=by):
                    sequence.status_read(await self._until(by, self._read_quiet(source)))
                case DrainOver(result=result, seconds=seconds):
                    self.drains[result] += 1
                    process.drained_clean = (result is DrainResult.CLEAN
                                             and spec.drain_mode == "door")
                    (self._log.info if result is DrainResult.CLEAN else self._log.warning)(
                        "engine_drained", pid=process.pid, mode=spec.drain_mode, result=result,
                        seconds=round(seconds, 3))
                case SendSignal(kill=kill_it, ends_work=ends_work, why=why):
                    if ends_work:
                        self._count_lost(stop.reason, process, source)
                    if kill_it:
                        self._log.warning("engine_killed", pid=process.pid, reason=why)
                        process.kill()
                    else:
                        self._log.info("engine_stopping", pid=process.pid,
                                       signal=spec.stop_signal)
                        process.signal_stop(spec.stop_signum)
                case WaitUntil(at=at):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(process.exited.wait(),
                                               max(0.0, at - self._clock()))
                case Finished():
                    return

    async def _until(self, deadline: float, answer: Coroutine[Any, Any, bool]) -> bool:
        """``answer``'s result, or False when it has none by the monotonic ``deadline``."""
        try:
            return await asyncio.wait_for(answer, max(0.0, deadline - self._clock()))
        except TimeoutError:
            return False

    async def _request_drain(self, process: SpawnRecord) -> bool:
        """Ask the engine to drain (``http``); False, logged, when it did not accept."""
        assert self._status_address is not None  # config: http needs the engine's address
        error = await request_drain(self._status_address,
                                    self._spec.drain_timeout + ENGINE_DEADLINE_SLACK)
        if error is not None:
            self._log.warning("engine_drain_refused", pid=process.pid, error=error)
        return error is None

    async def _read_quiet(self, source: StatusSource | None) -> bool:
        """Read the status while draining (it also keeps the count of work in flight fresh);
        True when it shows a quiet moment -- for a ``cuzk`` drain, ``GetStatus`` too; for a
        ``door`` drain, the door's count alone (it sees every call: no status is read)."""
        if self._spec.drain_mode == "door":
            return await self._read_door_drain(source)
        if source is None or not await source.poll():
            return False
        doc = source.latest()
        if doc is None:
            return False
        if self._spec.drain_mode != DrainMode.CUZK or self._grpc_address is None:
            return is_quiet(doc)
        return cuzk_idle(doc, await self._read_queues())

    async def _read_door_drain(self, source: StatusSource | None) -> bool:
        """A ``door`` drain's read: the door's count, and while it is not 0, what the engine
        shows of the work it holds (its ``/status`` and ``GetStatus``), which ends the wait
        for calls it dropped."""
        seat = self._seat
        if seat is None:
            return False
        if seat.in_flight() and source is not None:
            doc = source.latest() if await source.poll() else None
            queues = await self._read_queues() if self._grpc_address is not None else None
            seat.reading(door_reading(doc, queues))
        return seat.in_flight() == 0

    async def _read_queues(self) -> QueueReading:
        """The engine's GetStatus queues (kept for the stop's count of lost jobs)."""
        assert self._grpc_address is not None
        self._queues = await self._read_engine_queues(self._grpc_address,
                                                      self._spec.status_timeout)
        if not self._queues.known:
            self._limited.log(self._log, "warning", "engine_grpc_status_failed",
                              key="GetStatus", error=self._queues.error)
        return self._queues

    def _count_lost(self, reason: StopReason, process: SpawnRecord,
                    source: StatusSource | None) -> None:
        """Count the partitions and jobs in flight as the engine is stopped, by the last status
        read (and, for a cuzk engine, the drain's last GetStatus), when the stop counts them."""
        lost = lost_work(reason, source.latest() if source is not None else None, self._queues,
                         status_polled=source is not None, drained_clean=process.drained_clean)
        if lost is None:
            return
        self.stop_inflight[reason] += lost.partitions
        if lost.partitions:
            self._log.warning("engine_inflight_lost", reason=reason, partitions=lost.partitions)
        jobs = lost.jobs
        self.jobs_lost.update(jobs.by_kind)
        if jobs.by_kind:
            self._log.warning("engine_jobs_lost", reason=reason, jobs=jobs.by_kind,
                              job_ids=list(jobs.job_ids[:LOGGED_JOB_IDS]),
                              job_ids_left_out=max(0, len(jobs.job_ids) - LOGGED_JOB_IDS))
