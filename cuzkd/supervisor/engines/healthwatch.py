"""One engine's health loop and stall watch: its status polled while its process lives.

Each poll's result goes to the lifecycle (which decides what silence or a wrong answer leads
to), and a decoded document at the cadence's pace to the stall watch (which decides when work
without progress is a stall). Separate from the runner because it is a loop of its own, one per
process, that must survive its own bugs: a loop that dies is counted and started again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from structlog.typing import FilteringBoundLogger

from cuzkd.config import EngineConfig
from cuzkd.config.schema import StallAction
from cuzkd.errortext import error_text
from cuzkd.labelbudget import LabelBudgets
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.states import ALIVE, State
from cuzkd.status.client import TOO_LARGE, StatusSource
from cuzkd.status.derive import ExtensionDeriver
from cuzkd.supervisor.core.cadence import HealthCadence
from cuzkd.supervisor.core.drain import door_reading
from cuzkd.supervisor.core.freezes import said_nothing
from cuzkd.supervisor.core.lifecycle import Action, Lifecycle
from cuzkd.supervisor.core.stall import StallEvidence, StallWatch
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.engines.seat import DoorSeat
from cuzkd.supervisor.engines.spawnrecord import SpawnRecord
from cuzkd.supervisor.proc.descendants import DescendantWatch


class HealthWatch:
    """Polls one engine's status (if it has one) and watches it for stalls."""

    def __init__(self, spec: EngineConfig, lifecycle: Lifecycle, clock: RunClock, *,
                 status_address: str | None, labels: LabelBudgets,
                 descendants: DescendantWatch, seat: DoorSeat | None,
                 apply: Callable[[list[Action]], None], log: FilteringBoundLogger,
                 limited: LimitedLog) -> None:
        """``apply``: carries out the lifecycle's actions after a poll or a stall."""
        self._spec = spec
        self._lifecycle = lifecycle
        self._run_clock = clock
        self._labels = labels
        self._descendants = descendants
        self._seat = seat
        self._apply = apply
        self._log = log
        self._limited = limited
        #: None for an engine without a status URL: supervised by its process alone
        self.status_source = StatusSource(
            status_address, timeout=spec.status_timeout, log=log,
            # the polls nothing answers before the first answer, within start_timeout
            starting=lambda: lifecycle.in_start(clock.now()),
            deriver=self._new_deriver,
        ) if status_address is not None else None
        self.stall = StallWatch(spec.stall_after)
        self._cadence = HealthCadence(spec.health_interval, spec.start_timeout, spec.stall_after)
        #: times the health loop died of an exception and was started again
        self.health_loop_failures = 0

    def _new_deriver(self) -> ExtensionDeriver:
        """The deriver of a plain document, within this engine's label budgets."""
        return ExtensionDeriver(kinds=self._labels.budget("proof_kind"),
                                workers=self._labels.budget("worker"),
                                stale_after=self._spec.stale_job_after)

    def spawned(self, now: float) -> None:
        """A new process was spawned at ``now``: its polls and stall watch start afresh."""
        self._cadence.spawned()
        self.stall.started(now)

    async def run(self, process: SpawnRecord) -> None:
        """Run the health loop for as long as ``process`` lives: a loop that dies of an
        exception (a bug, a document nobody foresaw) is logged, counted and started again after
        ``health_interval`` -- an engine is never left without health checks while it runs."""
        while True:
            try:
                await self._loop(process)
                return
            except Exception as exc:  # whatever it was, supervision goes on
                self.health_loop_failures += 1
                self._limited.log(self._log, "error", "engine_health_loop_failed",
                                  key=type(exc).__name__, error=error_text(exc),
                                  exc_info=exc)
            await asyncio.sleep(self._spec.health_interval)

    async def _loop(self, process: SpawnRecord) -> None:
        cadence, lifecycle, clock = self._cadence, self._lifecycle, self._run_clock
        source = self.status_source
        if source is None:
            await asyncio.sleep(cadence.settle_delay)
            self._apply(lifecycle.settled(clock.now()))
            while lifecycle.state in ALIVE:  # no status to poll
                self._note_descendants(process)
                await asyncio.sleep(self._spec.health_interval)
            return
        while lifecycle.state in ALIVE:
            await asyncio.sleep(cadence.poll_delay(lifecycle.state))
            frozen_before = clock.frozen_seconds_total
            ok = await source.poll()
            self._note_descendants(process)
            error = None if ok else source.last_error
            now = clock.now()
            # A poll that timed out while the supervisor was frozen tells nothing of the engine.
            fresh = ok or not said_nothing(
                clock.frozen_seconds_total - frozen_before, self._spec.status_timeout)
            # The failures counted only: no answer while it starts is its start (a
            # start_timeout kill names the last error); a wrong answer is a fault at any time.
            # Once a stop began (the poll was in flight), failing is what it is expected to do.
            if (error is not None and fresh and source.last_error_counted
                    and lifecycle.state in ALIVE):
                # polled every 100 ms while starting: one line per 10 s per kind of error
                self._limited.log(self._log, "warning", "engine_status_failed",
                                  key=source.last_error_kind,
                                  state=str(lifecycle.state), error=error)
            self._apply(lifecycle.poll(now, ok, error, fresh=fresh,
                                       answered=source.last_error_kind == TOO_LARGE))
            if ok and self._seat is not None and self._seat.wants_reading():
                self._seat.reading(door_reading(source.latest(), None))
            if ok and lifecycle.state is State.RUNNING:
                process.oom.refresh()
                self._watch_stall(source, now)

    def _note_descendants(self, process: SpawnRecord) -> None:
        """Remember the live process's descendants (to stop them when it exits)."""
        if not process.exited.is_set():
            self._descendants.note(process.pid,
                                   walk=self._cadence.walk_due(self._run_clock.now()))

    def _watch_stall(self, status: StatusSource, now: float) -> None:
        """Feed the stall watch a decoded document at the cadence's pace (it decides on a
        scale of minutes; any change between two samples is progress, so sampling loses
        none)."""
        if not self._cadence.stall_sample_due(now):
            return
        doc = status.latest()
        if doc is None:
            return
        self._cadence.stall_sampled(now)
        evidence = self.stall.observe(now, doc, status.extensions())
        if evidence is not None:
            self._on_stall(now, evidence)

    def _on_stall(self, now: float, evidence: StallEvidence) -> None:
        """One structured event per stall, then the configured action."""
        busy = evidence.oldest_busy
        self._log.warning(
            "engine_stalled", pid=self._lifecycle.pid, reason=str(evidence.reason),
            action=str(self._spec.stall_action), limit_seconds=evidence.limit_seconds,
            since_progress_seconds=round(evidence.since_progress_seconds, 3),
            last_progress_at=time.time() - evidence.since_progress_seconds,
            phases=evidence.phases, queue_depth=evidence.queue_depth,
            oldest_busy=None if busy is None else {
                "worker": busy.worker, "job": busy.job, "partition": busy.partition,
                "proof_kind": busy.proof_kind, "busy_seconds": busy.busy_seconds})
        if self._spec.stall_action == StallAction.RESTART:
            self._apply(self._lifecycle.stalled(now))
