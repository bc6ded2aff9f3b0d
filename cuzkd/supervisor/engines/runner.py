"""The I/O shell around one engine's :class:`~cuzkd.supervisor.core.lifecycle.Lifecycle`:
the requests it takes and the lifecycle actions it carries out.

It turns requests (start, stop, restart), reaped exits and timers into lifecycle events and
carries out the actions the lifecycle returns: spawn, stop, schedule or cancel a restart. Each
other job is a part of its own, composed here: the spawn and its gate
(:mod:`.spawner`), carrying out the stop sequence (:mod:`.stopper`), the health loop and stall
watch (:mod:`.healthwatch`), the readings (:mod:`.readings`); the process's descendants are
its :class:`~cuzkd.supervisor.proc.descendants.DescendantWatch`'s. The rest of the supervisor
talks to this one object per engine, never to its parts. It owns every task it starts, and
:meth:`EngineRunner.close` cancels and awaits them all.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Callable

import structlog

from cuzkd.config import Config, EngineConfig, grpc_address, state_dir
from cuzkd.cuzk.client import read_queues
from cuzkd.gpus import GpuView
from cuzkd.labelbudget import LabelBudgets
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.metrics.sample import EngineSample
from cuzkd.states import (
    ALIVE,
    AT_REST,
    START_PENDING,
    SUPERVISOR_CAUSES,
    ExitCause,
    State,
    StopReason,
)
from cuzkd.status.client import StatusSource
from cuzkd.supervisor.core.backoff import Backoff
from cuzkd.supervisor.core.exitcause import (
    DAEMONIZED_ERROR,
    door_end,
    exit_message,
    process_cause,
)
from cuzkd.supervisor.core.handover import Child, EngineHandover
from cuzkd.supervisor.core.leftovers import LeftoverStop, leftover_stop
from cuzkd.supervisor.core.lifecycle import (
    Action,
    CancelScheduledStart,
    Lifecycle,
    Policy,
    ScheduleStart,
    Spawn,
    Stop,
)
from cuzkd.supervisor.core.outputbudget import OutputBudget, OutputLimits
from cuzkd.supervisor.core.spawngate import SpawnGate
from cuzkd.supervisor.core.stall import StallWatch
from cuzkd.supervisor.core.upgradegate import EngineMoment
from cuzkd.supervisor.engines.healthwatch import HealthWatch
from cuzkd.supervisor.engines.info import EngineInfo
from cuzkd.supervisor.engines.launch import BinaryResolver, EngineLaunch
from cuzkd.supervisor.engines.readings import EngineReadings
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.engines.seat import DoorSeat
from cuzkd.supervisor.engines.spawner import EngineSpawner, SpawnFailed
from cuzkd.supervisor.engines.spawnrecord import SpawnRecord
from cuzkd.supervisor.engines.stderrtail import ExitedTail
from cuzkd.supervisor.engines.stopper import EngineStopper, QueueReader
from cuzkd.supervisor.engines.telemetry import GrpcTelemetry
from cuzkd.supervisor.proc import pids
from cuzkd.supervisor.proc.children import ChildTable
from cuzkd.supervisor.proc.descendants import DescendantWatch
from cuzkd.supervisor.proc.output import OutputLog
from cuzkd.supervisor.proc.reaper import ended
from cuzkd.supervisor.tasks import TaskSet

log = structlog.get_logger("cuzkd.supervisor")


class EngineRunner:
    """Runs one configured engine: takes requests, carries out the lifecycle's actions and
    handles its process's exits; its processes are spawned through the ``children`` table.
    Wide, not deep: the rest of the supervisor talks to this one object per engine, so its
    queries stay here while the work is its parts' (spawner, stopper, health watch, readings)."""

    def __init__(
        self,
        spec: EngineConfig,
        config: Config,
        *,
        children: ChildTable,
        binary_resolver: BinaryResolver,
        on_change: Callable[[], None],
        gpu_view: GpuView | None = None,
        clock: RunClock | None = None,
        inherited_kills: int = 0,
        seat: DoorSeat | None = None,
        queue_reader: QueueReader = read_queues,
    ) -> None:
        """``clock``: the supervisor's clock every deadline is read from, blind to its own
        freezes (one for the whole supervisor); tests run the runner on an event loop with
        virtual time and pass a ``RunClock(loop.time)``. ``inherited_kills``: leftovers of
        the previous supervisor's process of this engine, stopped at start-up (counted as
        descendants killed). ``seat``: the engine's place behind a front door (None: Curio
        dials the engine itself), told when it can take calls and when not. ``queue_reader``:
        how a drain reads the engine's GetStatus queues (the gRPC transport's seam: tests on
        virtual time give a reader of their own)."""
        self.spec = spec
        self._run_clock = clock if clock is not None else RunClock()
        now = self._run_clock.now
        self._on_change = on_change
        #: the state machine; outside the runner, its queries (:attr:`state`,
        #: :meth:`not_up_reason`, :meth:`info`) are what the supervisor reads
        self.lifecycle = Lifecycle(
            Policy(spec.restart, spec.start_timeout, spec.unhealthy_after),
            Backoff(spec.backoff_initial, spec.backoff_max, spec.backoff_multiplier,
                    spec.backoff_reset_after),
        )
        self._log = engine_log = log.bind(engine=spec.name)
        #: repeated errors of this engine (spawn failing on every retry) log once per 10 s
        limited = LimitedLog()
        #: the label budgets of this engine's series and derived state, freed at each spawn
        self.labels = LabelBudgets(spec.name, spec.label_limits)
        #: cuzk's gRPC address (a cuzk engine's ``[daemon] listen``, or a cuzk or bundled
        #: engine's private address behind a door), read by a cuzk engine's drain and
        #: telemetry (a bundled engine's /status tells all of it), and given to its seat
        self._grpc_address = grpc_address(config, spec)
        self._seat = seat
        self._process: SpawnRecord | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tasks = TaskSet()
        self._changed = asyncio.Event()
        #: the current process's descendants, and the leftovers of exited ones being stopped
        self._descendants = DescendantWatch(spec.name, state_dir(config) / "procs",
                                            spec.stop_timeout, children, engine_log, limited)
        self._descendants.killed = inherited_kills
        #: a cuzk engine's gRPC telemetry (queues, GPUs, outcomes of every proof kind)
        self.telemetry = GrpcTelemetry(
            self._grpc_address, spec.status_timeout, spec.grpc_telemetry_interval,
            spec.start_timeout, now, engine_log, limited,
        ) if spec.cuzk and self._grpc_address and spec.grpc_telemetry_interval else None
        #: where its output goes: its lines under its own logger, within its output budget
        #: (one for both pipes and every process of it: the dropped counts are the engine's)
        output_budget = OutputBudget(_output_limits(spec), now())
        launch = EngineLaunch(spec, config, binary_resolver, gpu_view)
        self._spawner = EngineSpawner(
            launch, children, descendants=self._descendants,
            output=OutputLog(lines=structlog.get_logger("cuzkd.engine").bind(engine=spec.name),
                             notes=engine_log, budget=output_budget, clock=now),
            tasks=self._tasks, on_exit=self.on_exit, log=engine_log, limited=limited)
        self._health = HealthWatch(
            spec, self.lifecycle, self._run_clock, status_address=launch.status_address,
            labels=self.labels, descendants=self._descendants, seat=seat, apply=self._apply,
            log=engine_log, limited=limited)
        self._stopper = EngineStopper(
            spec, now, status_address=launch.status_address, grpc_address=self._grpc_address,
            seat=seat, queue_reader=queue_reader, log=engine_log, limited=limited)
        self._readings = EngineReadings(
            spec, self.lifecycle, self._run_clock, health=self._health, stopper=self._stopper,
            spawner=self._spawner, descendants=self._descendants, output_budget=output_budget,
            labels=self.labels, telemetry=self.telemetry, log=engine_log, limited=limited)

    # -- queries -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        return self.lifecycle.pid

    @property
    def state(self) -> State:
        return self.lifecycle.state

    @property
    def last_error(self) -> str | None:
        """Why the last status poll or spawn failed (None once one succeeded)."""
        return self.lifecycle.last_error

    @property
    def started_at(self) -> float | None:
        """Unix time of the current process's spawn (None: none runs)."""
        return self._process.started_at if self._process is not None else None

    @property
    def status_source(self) -> StatusSource | None:
        """Where its status is read (None for an engine without a status URL: supervised by
        its process alone)."""
        return self._health.status_source

    @status_source.setter
    def status_source(self, source: StatusSource | None) -> None:
        self._health.status_source = source

    @property
    def status_address(self) -> str | None:
        """Where the engine serves its status (None: supervised by its process alone)."""
        source = self._health.status_source
        return source.address if source is not None else None

    @property
    def stall(self) -> StallWatch:
        return self._health.stall

    @stall.setter
    def stall(self, watch: StallWatch) -> None:
        self._health.stall = watch

    @property
    def health_loop_failures(self) -> int:
        """Times the health loop died of an exception and was started again."""
        return self._health.health_loop_failures

    @property
    def drains(self) -> Counter[str]:
        """Drain result (clean, timeout) -> drains."""
        return self._stopper.drains

    @property
    def jobs_lost(self) -> Counter[str]:
        """Proof kind -> jobs the engine held when the supervisor stopped it (thrown away)."""
        return self._stopper.jobs_lost

    def not_up_reason(self) -> str:
        """Why the engine is not up, naming only what is known (never "error: None")."""
        m = self.lifecycle
        known = [f"last exit: {m.last_exit_cause}" if m.last_exit_cause else "",
                 f"error: {m.last_error}" if m.last_error else ""]
        detail = ", ".join(part for part in known if part)
        return f"engine is {m.state}" + (f" ({detail})" if detail else "")

    def info(self, release: str | None = None) -> EngineInfo:
        """This engine for the control API, ``/status`` and the CLI; ``release``: the one its
        process executes (the engine set knows the releases)."""
        return self._readings.entry(self._process, release)

    async def sample(self, max_age: float) -> EngineSample:
        """This engine for a scrape (:meth:`EngineReadings.sample
        <cuzkd.supervisor.engines.readings.EngineReadings.sample>`)."""
        return await self._readings.sample(self._process, max_age)

    # -- requests ------------------------------------------------------------------------

    async def wait_leftovers_stopped(self) -> None:
        """Until no leftover of this engine's exited processes is being stopped."""
        await self._descendants.wait_swept()

    def stop_leftovers(self, procs: set[pids.Proc]) -> None:
        """Stop ``procs`` (descendants adopted for this engine) as its leftovers are: the stop
        signal, SIGKILL after stop_timeout, counted as descendants killed."""
        self._descendants.stop(procs)

    def start(self) -> None:
        self._apply(self.lifecycle.start_requested(self._run_clock.now()))

    async def start_and_wait(self) -> None:
        """Start (if not running) and return once a process was spawned, spawning failed, or
        a stop came first."""
        spawns = self._spawner.spawns
        self.start()
        if self.lifecycle.state in START_PENDING:
            await self._wait_spawned(spawns)

    async def stop(self, reason: StopReason = StopReason.OPERATOR) -> None:
        """Stop and return once no process is left (the stop sequence bounds it)."""
        self.request_stop(reason)
        await self.wait_stopped()

    def request_stop(self, reason: StopReason = StopReason.OPERATOR, *,
                     within: float | None = None) -> None:
        """Begin the stop sequence (or cancel a pending restart) now, without waiting;
        ``within``: seconds the whole stop may take (a shutdown's grace: the drain gets what
        it leaves after stop_timeout)."""
        now = self._run_clock.now()
        # nothing runs yet: the spawn waiting is dropped
        abandoned = self.lifecycle.spawn_abandoned(now) if self._spawner.abandon() else []
        self._apply([*abandoned, *self.lifecycle.stop_requested(now, reason, within=within)])

    async def wait_stopped(self) -> None:
        await self.wait_for(lambda: self.lifecycle.state in AT_REST)

    async def restart(self, *, swap: bool = False) -> None:
        """Graceful stop then start; returns once the new process is spawned (or failed, or a
        stop overtook it). ``swap``: a binary swap's restart (exit cause ``swap`` instead of
        ``stopped``)."""
        spawns = self._spawner.spawns
        self._apply(self.lifecycle.restart_requested(self._run_clock.now(), swap=swap))
        await self._wait_spawned(spawns)

    async def _wait_spawned(self, spawns: int) -> None:
        """Until a spawn after the ``spawns``-th, or none is coming: ``failed``, or
        ``stopped`` -- a stop (the supervisor's shutdown) overtook the restart, and a wait
        for a spawn that will never come would hold its caller (a swap, a control request)
        and with it the shutdown. Right after a start or restart request the engine is never
        ``stopped``: it is stopping, in backoff, or starting (a spawn waiting)."""
        await self.wait_for(lambda: self._spawner.spawns != spawns
                            or self.lifecycle.state in AT_REST)

    def kill_now(self) -> None:
        """Skip the rest of the stop sequence (drain, stop_timeout): SIGKILL the group of a
        stopping engine, and the leftovers of exited ones still being stopped."""
        if self.lifecycle.state is State.STOPPING and self._process is not None:
            self._log.warning("engine_killed", pid=self._process.pid, reason="stop hurried")
            self._process.kill()
        self._descendants.kill_now()

    async def wait_for(self, predicate: Callable[[], bool], within: float | None = None) -> bool:
        """Wait until ``predicate()`` holds after some state change; False on timeout."""
        clock = self._run_clock.now
        deadline = None if within is None else clock() + within
        while not predicate():
            remaining = None if deadline is None else deadline - clock()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return False
        return True

    async def close(self) -> None:
        """Cancel and await every task; the process must already be gone (or be abandoned).

        Leftovers being stopped are seen to the end first (stop_timeout bounds it): an engine
        removed by a reload must not leave helpers that ignored SIGTERM running.
        """
        await self._descendants.close()
        if self._timer is not None:
            self._timer.cancel()
        await self._tasks.cancel_all()
        if self.status_source is not None:
            await self.status_source.close()

    # -- exits ---------------------------------------------------------------------------

    def on_exit(self, wait_status: int) -> None:
        """The reaper collected our process (the child table routed its exit here)."""
        process = self._process
        assert process is not None
        known = self._descendants.known_pids()
        leftovers = self._descendants.take_leftovers(process.pid)
        self._spawner.process_ended({process.pid, *known, *(p.pid for p in leftovers)})
        group_left = False
        match leftover_stop(stop_signalled=process.stop_signalled,
                            supervisor_killed=process.killed, leftovers=bool(leftovers)):
            case LeftoverStop.FINISH:
                self._descendants.stop(leftovers, process.pid, signalled=True)
            case LeftoverStop.KILL_GROUP:
                group_left = process.child.signal_group(signal.SIGKILL)
                if group_left:
                    self._log.info("engine_group_killed", pid=process.pid,
                                   reason="main process exited")
                if leftovers:
                    self._descendants.stop(leftovers, process.pid)
        self._process = None
        process.ended()
        cause, clean = process_cause(ended(wait_status), supervisor_killed=process.killed,
                                     oom_kills_moved=process.oom.moved(), cuzk=self.spec.cuzk,
                                     descendants_left=group_left or bool(leftovers))
        if self._seat is not None:
            self._seat.gone(door_end(cause, drained=process.drained_clean,
                                     stopped=process.killed or process.stop_signalled))
        if self.telemetry is not None:
            self.telemetry.forget()
        if cause == ExitCause.DAEMONIZED:
            self._log.warning("engine_daemonized", pid=process.pid, error=DAEMONIZED_ERROR,
                              pids=sorted(p.pid for p in leftovers))
        # Taken before the lifecycle acts: an immediate restart replaces the tail.
        tail = self._spawner.stderr.exited()
        self._apply(self.lifecycle.exited(cause, clean, self._run_clock.now()))
        counted = self.lifecycle.last_exit_cause
        self._log.info("engine_exited", pid=process.pid, cause=counted, process_cause=cause)
        if counted not in SUPERVISOR_CAUSES:
            self._tasks.start(self._report_unexpected_exit(process.pid, counted, tail))

    async def _report_unexpected_exit(self, pid: int, cause: str | None,
                                      tail: ExitedTail) -> None:
        """Log an exit nobody asked for with the engine's last stderr lines, once the reader
        has the rest of them (a leftover descendant may hold the pipe: bounded wait), and what
        they say it died of (a cuzk panic, its ``Error:`` line), which is also the engine's
        ``last_error`` while no new process was spawned."""
        stderr = self._spawner.stderr
        lines = await stderr.settle(tail)
        error = exit_message(cause, lines)
        self._log.warning("engine_exit_unexpected", pid=pid, cause=cause, stderr_tail=lines,
                          **({"error": error} if error is not None else {}))
        if error is not None and stderr.is_last(tail):
            self._apply(self.lifecycle.exit_explained(error))

    # -- cuzkd upgrade ---------------------------------------------------------------------

    def handover(self) -> EngineHandover:
        """The engine for the program that replaces the supervisor (at rest or running: see
        :mod:`~cuzkd.supervisor.core.upgradegate`)."""
        process = self._process
        child = None if process is None else Child(
            process.pid, process.child.stdout.fileno(), process.child.stderr.fileno())
        return EngineHandover(
            self.name, self.lifecycle.handover(), child,
            started_at=process.started_at if process is not None else None,
            admitted=process is not None and process.admitted)

    def moment(self) -> EngineMoment:
        """What the engine is doing, for the upgrade's gate."""
        return EngineMoment(self.name, self.lifecycle.state,
                            spawn_waiting=self._spawner.waiting,
                            sweeping=bool(self._descendants.sweeping))

    def adopt(self, handed: EngineHandover) -> None:
        """Carry on from the old code's :meth:`handover`: its process watched again (no signal,
        no spawn), its lifecycle where it was, a backoff's timer for what is left of it."""
        now = self._run_clock.now()
        actions = self.lifecycle.adopt(handed.lifecycle, now)
        if handed.process is not None:
            process = self._process = self._spawner.adopt(
                handed.process, handed.started_at or time.time())
            process.admitted = handed.admitted
            if handed.admitted and self._seat is not None:
                self._seat.adopted(self._answers_broken)
            self._watch(process, now)
        self._log.info("engine_adopted", pid=self.lifecycle.pid, state=str(self.lifecycle.state))
        self._apply(actions)

    # -- carrying out the lifecycle's actions --------------------------------------------

    def _apply(self, actions: list[Action]) -> None:
        pending = list(actions)
        while pending:
            match pending.pop(0):
                case Spawn():
                    gate = self._spawner.gate()
                    if gate is SpawnGate.OPEN:
                        pending.extend(self._spawn())
                    elif gate is not SpawnGate.WAITING_ALREADY:
                        self._spawner.wait_then(lambda: self._apply(self._spawn()))
                        pending.extend(self.lifecycle.spawn_waiting(gate.value))
                case Stop() as stop:
                    if self._process is not None:
                        self._tasks.start(self._stopper.run(stop, self._process,
                                                            self.status_source))
                case ScheduleStart(delay=delay):
                    self._timer = asyncio.get_running_loop().call_later(delay, self._elapsed)
                case CancelScheduledStart():
                    if self._timer is not None:
                        self._timer.cancel()
                        self._timer = None
        now = self._run_clock.now()
        for t in self.lifecycle.take_transitions():
            self._log.info("engine_state_changed", old=str(t.old), new=str(t.new), reason=t.reason,
                           pid=self.lifecycle.pid, cause=self.lifecycle.last_exit_cause,
                           restart_delay=_delay(self.lifecycle.next_start_at, now))
            if t.new is State.RUNNING:
                self._admit()
        self._changed.set()
        self._changed = asyncio.Event()
        self._on_change()

    def _spawn(self) -> list[Action]:
        """Spawn the process and start watching it; what the lifecycle wants next."""
        now = self._run_clock.now()
        process = self._spawner.spawn()
        if isinstance(process, SpawnFailed):
            return self.lifecycle.spawn_failed(process.error, now, transient=process.transient)
        self._process = process
        self.labels.clear()  # a new process: its values take the slots afresh
        actions = self.lifecycle.spawned(process.pid, now)
        self._watch(process, now)
        return actions

    def _watch(self, process: SpawnRecord, now: float) -> None:
        """Start the health loop (and telemetry) of a process spawned or adopted at ``now``."""
        self._health.spawned(now)
        process.watchers.append(self._tasks.start(self._health.run(process)))
        if self.telemetry is not None:
            process.watchers.append(self._tasks.start(self.telemetry.run(
                running=lambda: self.lifecycle.state is State.RUNNING,
                alive=lambda: self.lifecycle.state in ALIVE)))

    def _admit(self) -> None:
        """Tell the seat the engine takes calls, once per process: at its first answer
        (cuzk binds /status before its gRPC listener: the door's calls wait for that)."""
        process = self._process
        if (self._seat is None or process is None or process.admitted
                or self._grpc_address is None):
            return
        process.admitted = True
        self._seat.admit(self._grpc_address, self._answers_broken)

    def _answers_broken(self, error: str) -> None:
        """The door found this process's gRPC answers are not cuzk's messages: kill it and
        start another (the door has taken it out of rotation and retries its calls)."""
        self._log.warning("engine_answers_broken", pid=self.lifecycle.pid, error=error)
        self._apply(self.lifecycle.answers_broken(self._run_clock.now(), error))

    def _elapsed(self) -> None:
        self._timer = None
        self._apply(self.lifecycle.backoff_elapsed(self._run_clock.now()))


def _output_limits(spec: EngineConfig) -> OutputLimits:
    """The engine's ``output_*`` keys, as its output budget's limits."""
    return OutputLimits(spec.output_lines_per_second, spec.output_bytes_per_second,
                        spec.output_burst_lines, spec.output_burst_bytes)


def _delay(at: float | None, now: float) -> float | None:
    return None if at is None else max(0.0, at - now)
