"""The I/O shell around one engine's :class:`~cuzkd.supervisor.core.lifecycle.Lifecycle`.

It turns real happenings (spawn results, reaped exits, status polls, timers) into lifecycle
events and executes the actions the lifecycle returns: spawn, stop, schedule or cancel a
restart. The decisions around those are pure and made elsewhere: the stop's escalation by
:mod:`.stopsequence`, the health loop's pace by :mod:`.cadence`; the process's descendants are
its :class:`~cuzkd.supervisor.proc.descendants.DescendantWatch`'s, its last stderr lines its
:class:`~cuzkd.supervisor.engines.stderrtail.StderrTail`'s, what a spawn runs (command,
environment, status socket, the GPU memory wait) its
:class:`~cuzkd.supervisor.engines.launch.EngineLaunch`'s. The rest of the supervisor reads
the engine through the runner's queries (:attr:`EngineRunner.state`,
:meth:`EngineRunner.not_up_reason`, :meth:`EngineRunner.info`), never its lifecycle or
descendant watch. It owns every task it starts -- the health poll, the stop sequence, the two
output readers -- and :meth:`EngineRunner.close` cancels and awaits them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from cuzkd.config import Config, EngineConfig
from cuzkd.config.schema import DrainMode
from cuzkd.cuzk.client import read_queues
from cuzkd.cuzk.reading import QueueReading
from cuzkd.errors import SpawnError
from cuzkd.errortext import error_text
from cuzkd.gpus import GpuView
from cuzkd.labelbudget import LabelBudgets
from cuzkd.log.ratelimit import LimitedLog, errno_name
from cuzkd.metrics.sample import EngineSample
from cuzkd.states import (
    ALIVE,
    AT_REST,
    INTENT_CAUSES,
    START_PENDING,
    DrainResult,
    ExitCause,
    State,
    StopReason,
)
from cuzkd.status.client import TOO_LARGE, StatusSource
from cuzkd.status.derive import ExtensionDeriver
from cuzkd.status.document import IN_FLIGHT_STATES
from cuzkd.supervisor.core.backoff import Backoff
from cuzkd.supervisor.core.cadence import HealthCadence
from cuzkd.supervisor.core.drain import (
    count_partitions,
    cuzk_idle,
    door_reading,
    is_quiet,
    lost_jobs,
)
from cuzkd.supervisor.core.exitcause import (
    DAEMONIZED_ERROR,
    door_end,
    exit_message,
    process_cause,
)
from cuzkd.supervisor.core.freezes import said_nothing
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
from cuzkd.supervisor.core.stall import StallEvidence, StallWatch
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
from cuzkd.supervisor.engines.info import MAX_STALE_JOBS_SHOWN, EngineInfo
from cuzkd.supervisor.engines.launch import BinaryResolver, EngineLaunch
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.engines.seat import DoorSeat
from cuzkd.supervisor.engines.stderrtail import ExitedTail, StderrTail
from cuzkd.supervisor.engines.telemetry import GrpcTelemetry
from cuzkd.supervisor.proc import pids
from cuzkd.supervisor.proc.children import SPAWN_ERRORS, ChildProcess, ChildTable
from cuzkd.supervisor.proc.descendants import DescendantWatch
from cuzkd.supervisor.proc.oom import OomCounters
from cuzkd.supervisor.proc.output import OutputLog, log_lines
from cuzkd.supervisor.proc.reaper import ended
from cuzkd.supervisor.proc.spawn import spawn_error_is_transient
from cuzkd.supervisor.proc.tree import tree_usage
from cuzkd.supervisor.tasks import TaskSet

log = structlog.get_logger("cuzkd.supervisor")

#: Reads an engine's GetStatus queues: (its gRPC address, a timeout) -> the reading.
QueueReader = Callable[[str, float], Coroutine[Any, Any, QueueReading]]

#: Job ids named in one ``engine_jobs_lost`` event: an engine listing thousands of jobs
#: must not make one log line of megabytes (the counts stay exact).
LOGGED_JOB_IDS = 100


class EngineRunner:
    """Runs one configured engine; its processes are spawned through the ``children`` table."""

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
        self._clock = self._run_clock.now
        #: what a spawn runs: command, environment, status socket, the GPU memory gate
        self._launch = EngineLaunch(spec, config, binary_resolver, gpu_view)
        self._children = children
        self._on_change = on_change
        #: the state machine; outside the runner, its queries (:attr:`state`,
        #: :meth:`not_up_reason`, :meth:`info`) are what the supervisor reads
        self.lifecycle = Lifecycle(
            Policy(spec.restart, spec.start_timeout, spec.unhealthy_after),
            Backoff(spec.backoff_initial, spec.backoff_max, spec.backoff_multiplier,
                    spec.backoff_reset_after),
        )
        self._log = log.bind(engine=spec.name)
        #: the label budgets of this engine's series and derived state, freed at each spawn
        self.labels = LabelBudgets(spec.name, spec.label_limits)
        #: cuzk's gRPC address (a cuzk engine's ``[daemon] listen``, or a cuzk or bundled
        #: engine's private address behind a door), read by a cuzk engine's drain and
        #: telemetry (a bundled engine's /status tells all of it), and given to its seat
        self._grpc_address = config.grpc_address(spec)
        self._seat = seat
        self._read_engine_queues = queue_reader
        #: the current process was admitted by its seat (at its first answer)
        self._admitted = False
        #: the current process's stop drained it through the door: nothing was in flight
        self._drained_clean = False
        #: the last GetStatus of the current stop's drain (None: none read in this stop)
        self._queues: QueueReading | None = None
        #: None for an engine without a status URL: supervised by its process alone
        self.status_source = StatusSource(
            self.status_address, timeout=spec.status_timeout, log=self._log,
            # the polls nothing answers before the first answer, within start_timeout
            starting=lambda: self.lifecycle.in_start(self._clock()),
            deriver=self._new_deriver,
        ) if self.status_address is not None else None
        self._process: ChildProcess | None = None
        self._exited: asyncio.Event = asyncio.Event()
        self.started_at: float | None = None  # unix time of the current spawn
        self._spawns = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks = TaskSet()
        self._health_task: asyncio.Task[None] | None = None
        self._telemetry_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self.stall = StallWatch(spec.stall_after)
        self._cadence = HealthCadence(spec.health_interval, spec.start_timeout, spec.stall_after)
        #: the spawn waiting for leftovers or GPU memory, if any
        self._gate: asyncio.Task[None] | None = None
        self._oom: OomCounters | None = None
        #: the current process's last stderr lines; the dead one's, once it exited
        self._stderr = StderrTail()
        #: the supervisor sent SIGKILL to the current process (never an OOM kill then)
        self._killed = False
        #: the stop signal went to the current process's group (its survivors may finish)
        self._stop_signalled = False
        #: repeated errors of this engine (spawn failing on every retry) log once per 10 s
        self._limited = LimitedLog()
        #: the current process's descendants, and the leftovers of exited ones being stopped
        self._descendants = DescendantWatch(spec.name, config.state_dir / "procs",
                                            spec.stop_timeout, children, self._log,
                                            self._limited)
        self._descendants.killed = inherited_kills
        #: a cuzk engine's gRPC telemetry (queues, GPUs, outcomes of every proof kind)
        self.telemetry = GrpcTelemetry(
            self._grpc_address, spec.status_timeout, spec.grpc_telemetry_interval,
            spec.start_timeout, self._clock, self._log, self._limited,
        ) if spec.cuzk and self._grpc_address and spec.grpc_telemetry_interval else None
        #: why the next stop is made (None: a health kill, not counted)
        self._stop_reason: StopReason | None = None
        #: seconds the next stop may take in all (a shutdown's grace; None: its own budget)
        self._stop_within: float | None = None
        #: reason -> partitions in flight when the supervisor stopped the engine
        self.stop_inflight: Counter[str] = Counter()
        #: proof kind -> jobs the engine held when the supervisor stopped it (thrown away)
        self.jobs_lost: Counter[str] = Counter()
        #: drain result (clean, timeout) -> drains
        self.drains: Counter[str] = Counter()
        #: times the health loop died of an exception and was started again
        self.health_loop_failures = 0
        #: where its output goes: its lines under its own logger, within its output budget
        #: (one for both pipes and every process of it: the dropped counts are the engine's)
        self._output_budget = OutputBudget(_output_limits(spec), self._clock())
        self._output = OutputLog(
            lines=structlog.get_logger("cuzkd.engine").bind(engine=spec.name), notes=self._log,
            budget=self._output_budget, clock=self._clock)

    def _new_deriver(self) -> ExtensionDeriver:
        """The deriver of a plain document, within this engine's label budgets."""
        return ExtensionDeriver(kinds=self.labels.budget("proof_kind"),
                                workers=self.labels.budget("worker"),
                                stale_after=self.spec.stale_job_after)

    # -- requests ------------------------------------------------------------------------

    @property
    def argv(self) -> list[str]:
        """The command as configured (``{binary}`` unresolved)."""
        return self._launch.argv

    @property
    def status_address(self) -> str | None:
        """Where the engine serves its status (None: supervised by its process alone)."""
        return self._launch.status_address

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

    def not_up_reason(self) -> str:
        """Why the engine is not up, naming only what is known (never "error: None")."""
        m = self.lifecycle
        known = [f"last exit: {m.last_exit_cause}" if m.last_exit_cause else "",
                 f"error: {m.last_error}" if m.last_error else ""]
        detail = ", ".join(part for part in known if part)
        return f"engine is {m.state}" + (f" ({detail})" if detail else "")

    async def wait_leftovers_stopped(self) -> None:
        """Until no leftover of this engine's exited processes is being stopped."""
        await self._descendants.wait_swept()

    def stop_leftovers(self, procs: set[pids.Proc]) -> None:
        """Stop ``procs`` (descendants adopted for this engine) as its leftovers are: the stop
        signal, SIGKILL after stop_timeout, counted as descendants killed."""
        self._descendants.stop(procs)

    def start(self) -> None:
        self._apply(self.lifecycle.start_requested(self._clock()))

    async def start_and_wait(self) -> None:
        """Start (if not running) and return once a process was spawned, spawning failed, or
        a stop came first."""
        spawns = self._spawns
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
        self._stop_reason, self._stop_within = reason, within
        abandoned: list[Action] = []
        if self._gate is not None:  # nothing runs yet: the spawn waiting is dropped
            self._gate.cancel()
            self._gate = None
            self._log.info("gpu_gate_abandoned" if self._launch.gated
                           else "engine_spawn_abandoned", reason="stop requested")
            abandoned = self.lifecycle.spawn_abandoned(self._clock())
        self._apply([*abandoned, *self.lifecycle.stop_requested(self._clock())])

    async def wait_stopped(self) -> None:
        await self.wait_for(lambda: self.lifecycle.state in AT_REST)

    async def restart(self, *, swap: bool = False) -> None:
        """Graceful stop then start; returns once the new process is spawned (or failed, or a
        stop overtook it). ``swap``: a binary swap's restart (exit cause ``swap`` instead of
        ``stopped``)."""
        spawns = self._spawns
        self._stop_reason = StopReason.SWAP if swap else StopReason.OPERATOR
        self._apply(self.lifecycle.restart_requested(self._clock(), swap=swap))
        await self._wait_spawned(spawns)

    async def _wait_spawned(self, spawns: int) -> None:
        """Until a spawn after the ``spawns``-th, or none is coming: ``failed``, or
        ``stopped`` -- a stop (the supervisor's shutdown) overtook the restart, and a wait
        for a spawn that will never come would hold its caller (a swap, a control request)
        and with it the shutdown. Right after a start or restart request the engine is never
        ``stopped``: it is stopping, in backoff, or starting (a spawn waiting)."""
        await self.wait_for(lambda: self._spawns != spawns
                            or self.lifecycle.state in AT_REST)

    def kill_now(self) -> None:
        """Skip the rest of the stop sequence (drain, stop_timeout): SIGKILL the group of a
        stopping engine, and the leftovers of exited ones still being stopped."""
        if self.lifecycle.state is State.STOPPING and self._process is not None:
            self._log.warning("engine_killed", pid=self._process.pid, reason="stop hurried")
            self._kill(self._process)
        self._descendants.kill_now()

    async def wait_for(self, predicate: Callable[[], bool], within: float | None = None) -> bool:
        """Wait until ``predicate()`` holds after some state change; False on timeout."""
        deadline = None if within is None else self._clock() + within
        while not predicate():
            remaining = None if deadline is None else deadline - self._clock()
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

    # -- events from the supervisor --------------------------------------------------------

    def on_exit(self, wait_status: int) -> None:
        """The reaper collected our process (the child table routed its exit here)."""
        proc = self._process
        assert proc is not None
        known = self._descendants.known_pids()
        leftovers = self._descendants.take_leftovers(proc.pid)
        self._launch.previous_process_ended({proc.pid, *known, *(p.pid for p in leftovers)})
        group_left = False
        if self._stop_signalled and not self._killed and leftovers:
            # The stop signal reached the whole group, and a wrapper shell that does not exec
            # dies of it at once while the engine under it still shuts down: what is left gets
            # stop_timeout to finish (no second signal), then SIGKILL.
            self._descendants.stop(leftovers, proc.pid, signalled=True)
        else:
            # Leftover helpers of a dead engine would hold GPU memory (or its port) from its
            # replacement: its group dies at once, escaped descendants get stop_timeout.
            group_left = proc.signal_group(signal.SIGKILL)
            if group_left:
                self._log.info("engine_group_killed", pid=proc.pid, reason="main process exited")
            if leftovers:
                self._descendants.stop(leftovers, proc.pid)
        self._process = None
        self.started_at = None
        self._exited.set()
        oom_moved = self._oom is not None and self._oom.moved()
        cause, clean = process_cause(ended(wait_status), supervisor_killed=self._killed,
                                     oom_kills_moved=oom_moved, cuzk=self.spec.cuzk,
                                     descendants_left=group_left or bool(leftovers))
        if self._seat is not None:
            self._seat.gone(door_end(cause, drained=self._drained_clean,
                                     stopped=self._killed or self._stop_signalled))
        if self._health_task is not None:
            self._health_task.cancel()
        if self._telemetry_task is not None:
            self._telemetry_task.cancel()
        if self.telemetry is not None:
            self.telemetry.forget()
        if cause == ExitCause.DAEMONIZED:
            self._log.warning("engine_daemonized", pid=proc.pid, error=DAEMONIZED_ERROR,
                              pids=sorted(p.pid for p in leftovers))
        # Taken before the lifecycle acts: an immediate restart replaces the tail.
        tail = self._stderr.exited()
        self._apply(self.lifecycle.exited(cause, clean, self._clock()))
        counted = self.lifecycle.last_exit_cause
        self._log.info("engine_exited", pid=proc.pid, cause=counted, process_cause=cause)
        if counted not in INTENT_CAUSES:
            self._track(self._report_unexpected_exit(proc.pid, counted, tail))

    async def _report_unexpected_exit(self, pid: int, cause: str | None,
                                      tail: ExitedTail) -> None:
        """Log an exit nobody asked for with the engine's last stderr lines, once the reader
        has the rest of them (a leftover descendant may hold the pipe: bounded wait), and what
        they say it died of (a cuzk panic, its ``Error:`` line), which is also the engine's
        ``last_error`` while no new process was spawned."""
        lines = await self._stderr.settle(tail)
        error = exit_message(cause, lines)
        self._log.warning("engine_exit_unexpected", pid=pid, cause=cause, stderr_tail=lines,
                          **({"error": error} if error is not None else {}))
        if error is not None and self._stderr.is_last(tail):
            self._apply(self.lifecycle.exit_explained(error))

    # -- executing actions -------------------------------------------------------------

    def _apply(self, actions: list[Action]) -> None:
        pending = list(actions)
        while pending:
            match pending.pop(0):
                case Spawn():
                    if self._gate is not None:
                        continue  # the spawn waiting (leftovers, GPU memory) is the one asked for
                    if self._launch.gated or self._descendants.sweeping:
                        self._gate = self._track(self._spawn_when_ready())
                        pending.extend(self.lifecycle.spawn_waiting(
                            "waiting for the previous process's leftovers to stop"
                            if self._descendants.sweeping else "waiting for GPU memory"))
                    else:
                        pending.extend(self._spawn())
                case Stop(kill=kill, drain=drain, why=why):
                    reason, self._stop_reason = self._stop_reason, None
                    within, self._stop_within = self._stop_within, None
                    self._track(self._stop_guarded(kill=kill, drain=drain, reason=reason,
                                                   within=within, why=why))
                case ScheduleStart(delay=delay):
                    self._timer = asyncio.get_running_loop().call_later(delay, self._elapsed)
                case CancelScheduledStart():
                    if self._timer is not None:
                        self._timer.cancel()
                        self._timer = None
        # a reason (and a bound) belongs to the request that set it
        self._stop_reason, self._stop_within = None, None
        for t in self.lifecycle.take_transitions():
            self._log.info("engine_state_changed", old=str(t.old), new=str(t.new), reason=t.reason,
                           pid=self.lifecycle.pid, cause=self.lifecycle.last_exit_cause,
                           restart_delay=_delay(self.lifecycle.next_start_at, self._clock()))
            if t.new is State.RUNNING:
                self._admit()
        self._changed.set()
        self._changed = asyncio.Event()
        self._on_change()

    def _admit(self) -> None:
        """Tell the seat the engine takes calls, once per process: at its first answer
        (cuzk binds /status before its gRPC listener: the door's calls wait for that)."""
        if self._seat is None or self._admitted or self._grpc_address is None:
            return
        self._admitted = True
        self._seat.admit(self._grpc_address, self._answers_broken)

    def _answers_broken(self, error: str) -> None:
        """The door found this process's gRPC answers are not cuzk's messages: kill it and
        start another (the door has taken it out of rotation and retries its calls)."""
        self._log.warning("engine_answers_broken", pid=self.lifecycle.pid, error=error)
        self._apply(self.lifecycle.answers_broken(self._clock(), error))

    def _note_descendants(self) -> None:
        """Remember the current process's live descendants (to stop them when it exits)."""
        if self._process is not None:
            self._descendants.note(self._process.pid,
                                  walk=self._cadence.walk_due(self._clock()))

    def _elapsed(self) -> None:
        self._timer = None
        self._apply(self.lifecycle.backoff_elapsed(self._clock()))

    async def _spawn_when_ready(self) -> None:
        """Spawn once the previous process's leftovers are gone -- a helper that ignored
        SIGTERM holds its port or GPU memory until killed (``stop_timeout`` bounds it), and a
        replacement spawned meanwhile would fail and count as a crash -- and, for an engine
        pinned to GPUs, once they hold nothing of the previous process and have
        ``gpu_memory_needed`` free, or after ``gpu_release_timeout`` (then say why)."""
        if self._descendants.sweeping:
            self._log.info("engine_spawn_waiting",
                           pids=sorted(p.pid for p in self._descendants.sweeping))
            await self._descendants.wait_swept()
        await self._launch.wait_for_gpus(self._log)
        self._gate = None
        self._apply(self._spawn())

    def _spawn(self) -> list[Action]:
        """Spawn the process; what the lifecycle wants next if that failed."""
        now = self._clock()
        try:
            argv = self._launch.command()
            self._launch.prepare()
            proc = self._children.spawn(argv, self._launch.environment(), self.on_exit)
        except (*SPAWN_ERRORS, SpawnError) as exc:
            # ValueError: execve's argument rules (NUL bytes); raised, it would escape the reaper.
            transient = spawn_error_is_transient(exc)
            self._limited.log(self._log, "error", "engine_spawn_failed", key=errno_name(exc),
                              error=str(exc), errno=errno_name(exc), transient=transient,
                              argv=self.argv)
            return self.lifecycle.spawn_failed(str(exc), now, transient=transient)
        self._process = proc
        self._cadence.spawned()
        self._descendants.spawned(proc.pid)
        self._exited = asyncio.Event()
        self.started_at = time.time()
        self._spawns += 1
        self.labels.clear()  # a new process: its values take the slots afresh
        self._killed = False
        self._stop_signalled = False
        self._admitted = self._drained_clean = False
        self._oom = OomCounters(proc.pid)
        self.stall.started(now)
        actions = self.lifecycle.spawned(proc.pid, now)
        self._log.info("engine_spawned", pid=proc.pid, argv=argv)
        self._track(log_lines(proc.stdout, self._output, "stdout", proc.pid))
        self._stderr.read_by(self._track(log_lines(proc.stderr, self._output, "stderr",
                                                   proc.pid, tail=self._stderr.spawned())))
        self._health_task = self._track(self._supervise_health())
        if self.telemetry is not None:
            self._telemetry_task = self._track(self.telemetry.run(
                running=lambda: self.lifecycle.state is State.RUNNING,
                alive=lambda: self.lifecycle.state in ALIVE))
        return actions

    async def _stop_guarded(self, *, kill: bool, drain: bool, reason: StopReason | None,
                            within: float | None, why: str) -> None:
        """:meth:`_stop_process`, whose failure (a bug) still ends in the process's end: its
        group is SIGKILLed, so the engine never stays ``stopping`` with nothing stopping it."""
        proc = self._process
        try:
            await self._stop_process(kill=kill, drain=drain, reason=reason, within=within,
                                     why=why)
        except Exception as exc:  # the stop must end whatever went wrong
            self._log.error("engine_stop_failed", error=error_text(exc), exc_info=exc)
            if proc is not None and proc is self._process:
                self._kill(proc)

    async def _stop_process(self, *, kill: bool, drain: bool, reason: StopReason | None,
                            within: float | None, why: str) -> None:
        """Carry out the stop sequence (:mod:`.stopsequence` decides every step): drain (at
        most drain_timeout, less when the stop must end ``within`` seconds), the stop signal,
        SIGKILL of the group after stop_timeout; ``kill`` skips to SIGKILL (``why``: the
        lifecycle's word for it, in the kill's log)."""
        proc = self._process
        if proc is None:
            return
        exited, spec = self._exited, self.spec
        self._queues = None
        sequence = StopSequence.begin(
            self._clock(), drain_mode=spec.drain_mode if drain else DrainMode.NONE,
            drain_timeout=spec.drain_timeout, stop_timeout=spec.stop_timeout,
            health_interval=spec.health_interval, kill_reason=why if kill else None,
            within=within)
        if self._seat is not None:  # every stop, drained or not: no new call goes to it
            self._seat.stop_admitting(sequence.deadline_work_window(self._clock(), reason))
        if sequence.draining:
            self._log.info("engine_drain_requested", pid=proc.pid, mode=spec.drain_mode,
                           timeout=round(sequence.deadline - sequence.started, 3))
        while True:
            match sequence.step(self._clock(), exited=exited.is_set(), killed=self._killed):
                case RequestDrain(by=by):
                    sequence.drain_answered(await self._until(by, self._request_drain(proc)))
                case ReadStatus(by=by):
                    sequence.status_read(await self._until(by, self._read_quiet()))
                case DrainOver(result=result, seconds=seconds):
                    self.drains[result] += 1
                    self._drained_clean = (result is DrainResult.CLEAN
                                           and spec.drain_mode == "door")
                    (self._log.info if result is DrainResult.CLEAN else self._log.warning)(
                        "engine_drained", pid=proc.pid, mode=spec.drain_mode, result=result,
                        seconds=round(seconds, 3))
                case SendSignal(kill=kill_it, ends_work=ends_work, why=why):
                    if ends_work:
                        self._count_inflight(reason)
                    if kill_it:
                        self._log.warning("engine_killed", pid=proc.pid, reason=why)
                        self._kill(proc)
                    else:
                        self._log.info("engine_stopping", pid=proc.pid, signal=spec.stop_signal)
                        self._stop_signalled = True
                        proc.signal_group(spec.stop_signum)
                case WaitUntil(at=at):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(exited.wait(), max(0.0, at - self._clock()))
                case Finished():
                    return

    async def _until(self, deadline: float, answer: Coroutine[Any, Any, bool]) -> bool:
        """``answer``'s result, or False when it has none by the monotonic ``deadline``."""
        try:
            return await asyncio.wait_for(answer, max(0.0, deadline - self._clock()))
        except TimeoutError:
            return False

    async def _request_drain(self, proc: ChildProcess) -> bool:
        """Ask the engine to drain (``http``); False, logged, when it did not accept."""
        assert self.status_address is not None  # config: http needs the engine's address
        error = await request_drain(self.status_address,
                                    self.spec.drain_timeout + ENGINE_DEADLINE_SLACK)
        if error is not None:
            self._log.warning("engine_drain_refused", pid=proc.pid, error=error)
        return error is None

    async def _read_quiet(self) -> bool:
        """Read the status while draining (it also keeps the count of work in flight fresh);
        True when it shows a quiet moment -- for a ``cuzk`` drain, ``GetStatus`` too; for a
        ``door`` drain, the door's count alone (it sees every call: no status is read)."""
        if self.spec.drain_mode == "door":
            return await self._read_door_drain()
        if self.status_source is None or not await self.status_source.poll():
            return False
        doc = self.status_source.latest()
        if doc is None:
            return False
        if self.spec.drain_mode != "cuzk" or self._grpc_address is None:
            return is_quiet(doc)
        return cuzk_idle(doc, await self._read_queues())

    async def _read_door_drain(self) -> bool:
        """A ``door`` drain's read: the door's count, and while it is not 0, what the engine
        shows of the work it holds (its ``/status`` and ``GetStatus``), which ends the wait
        for calls it dropped."""
        seat = self._seat
        if seat is None:
            return False
        if seat.in_flight() and self.status_source is not None:
            doc = self.status_source.latest() if await self.status_source.poll() else None
            queues = await self._read_queues() if self._grpc_address is not None else None
            seat.reading(door_reading(doc, queues))
        return seat.in_flight() == 0

    async def _read_queues(self) -> QueueReading:
        """The engine's GetStatus queues (kept for the stop's count of lost jobs)."""
        assert self._grpc_address is not None
        self._queues = await self._read_engine_queues(self._grpc_address,
                                                      self.spec.status_timeout)
        if not self._queues.known:
            self._limited.log(self._log, "warning", "engine_grpc_status_failed",
                              key="GetStatus", error=self._queues.error)
        return self._queues

    def _count_inflight(self, reason: StopReason | None) -> None:
        """Count the partitions and jobs in flight, by the last status read (and, for a cuzk
        engine, the drain's last GetStatus), as the engine is stopped: what this stop throws
        away. Health kills (reason None) are not counted, nor a stop the door drained: it saw
        every call end (the last status read, before the drain, may list jobs done since)."""
        if reason is None or self.status_source is None or self._drained_clean:
            return
        doc = self.status_source.latest()
        lost = count_partitions(doc, IN_FLIGHT_STATES)
        self.stop_inflight[reason] += lost
        if lost:
            self._log.warning("engine_inflight_lost", reason=reason, partitions=lost)
        jobs = lost_jobs(doc, self._queues)
        self.jobs_lost.update(jobs.by_kind)
        if jobs.by_kind:
            self._log.warning("engine_jobs_lost", reason=reason, jobs=jobs.by_kind,
                              job_ids=list(jobs.job_ids[:LOGGED_JOB_IDS]),
                              job_ids_left_out=max(0, len(jobs.job_ids) - LOGGED_JOB_IDS))

    def _kill(self, proc: ChildProcess) -> None:
        """SIGKILL the group, remembering it so the death is not blamed on the OOM killer."""
        if proc is self._process:
            self._killed = True
        proc.signal_group(signal.SIGKILL)

    async def _supervise_health(self) -> None:
        """Run the health loop for as long as the process lives: a loop that dies of an
        exception (a bug, a document nobody foresaw) is logged, counted and started again after
        ``health_interval`` -- an engine is never left without health checks while it runs."""
        while True:
            try:
                await self._health_loop()
                return
            except Exception as exc:  # whatever it was, supervision goes on
                self.health_loop_failures += 1
                self._limited.log(self._log, "error", "engine_health_loop_failed",
                                  key=type(exc).__name__, error=error_text(exc),
                                  exc_info=exc)
            await asyncio.sleep(self.spec.health_interval)

    async def _health_loop(self) -> None:
        cadence = self._cadence
        if self.status_source is None:
            await asyncio.sleep(cadence.settle_delay)
            self._apply(self.lifecycle.settled(self._clock()))
            while self.lifecycle.state in ALIVE:  # no status to poll
                self._note_descendants()
                await asyncio.sleep(self.spec.health_interval)
            return
        while self.lifecycle.state in ALIVE:
            await asyncio.sleep(cadence.poll_delay(self.lifecycle.state))
            frozen_before = self._run_clock.frozen_seconds_total
            ok = await self.status_source.poll()
            self._note_descendants()
            error = None if ok else self.status_source.last_error
            now = self._clock()
            # A poll that timed out while the supervisor was frozen tells nothing of the engine.
            fresh = ok or not said_nothing(
                self._run_clock.frozen_seconds_total - frozen_before, self.spec.status_timeout)
            # The failures counted only: no answer while it starts is its start (a
            # start_timeout kill names the last error); a wrong answer is a fault at any time.
            # Once a stop began (the poll was in flight), failing is what it is expected to do.
            if (error is not None and fresh and self.status_source.last_error_counted
                    and self.lifecycle.state in ALIVE):
                # polled every 100 ms while starting: one line per 10 s per kind of error
                self._limited.log(self._log, "warning", "engine_status_failed",
                                  key=self.status_source.last_error_kind,
                                  state=str(self.lifecycle.state), error=error)
            self._apply(self.lifecycle.poll(
                now, ok, error, fresh=fresh,
                answered=self.status_source.last_error_kind == TOO_LARGE))
            if ok and self._seat is not None and self._seat.wants_reading():
                self._seat.reading(door_reading(self.status_source.latest(), None))
            if ok and self.lifecycle.state is State.RUNNING:
                if self._oom is not None:
                    self._oom.refresh()
                self._watch_stall(self.status_source, now)

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
            "engine_stalled", pid=self.lifecycle.pid, reason=evidence.reason,
            action=self.spec.stall_action, limit_seconds=evidence.limit_seconds,
            since_progress_seconds=round(evidence.since_progress_seconds, 3),
            last_progress_at=time.time() - evidence.since_progress_seconds,
            phases=evidence.phases, queue_depth=evidence.queue_depth,
            oldest_busy=None if busy is None else {
                "worker": busy.worker, "job": busy.job, "partition": busy.partition,
                "proof_kind": busy.proof_kind, "busy_seconds": busy.busy_seconds})
        if self.spec.stall_action == "restart":
            self._stop_reason = StopReason.STALL
            self._apply(self.lifecycle.stalled(now))

    def _track(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return self._tasks.start(coro)

    # -- readings ------------------------------------------------------------------------

    def info(self, release: str | None = None) -> EngineInfo:
        """This engine for the control API, ``/status`` and the CLI; ``release``: the one its
        process executes (the engine set knows the releases)."""
        m, source = self.lifecycle, self.status_source
        stale, phantom = source.failed_work() if source is not None else ([], [])
        return EngineInfo(
            name=self.name,
            state=m.state,
            pid=m.pid,
            started_at=self.started_at,
            restarts=m.restarts,
            last_exit_cause=m.last_exit_cause,
            exits=dict(m.exits),
            next_restart_at=(_wall(m.next_start_at, self._clock())
                             if m.state is State.BACKOFF else None),
            last_error=m.last_error,
            waiting_for_gpu=self._gate is not None and self._launch.gated,
            stalled=self.stall.stalled,
            stalls_total=self.stall.stalls_total,
            last_exit_stderr=list(self._stderr.last_exit),
            status_address=self.status_address,
            command=list(self.argv),
            release=release,
            # the last decoded document's values that did not decode (a healthy engine)
            status_field_errors=source.field_errors if source is not None else None,
            stale_jobs=sorted(stale, key=lambda job: -job.age_secs)[:MAX_STALE_JOBS_SHOWN],
            phantom_busy_workers=phantom,
        )

    async def sample(self, max_age: float) -> EngineSample:
        """This engine for a scrape. Whatever goes wrong reading its document or its process
        tree costs only those figures (status absent, so ``cuzkd_engine_up`` 0), logged: one
        engine never fails the scrape of every other."""
        alive = self.lifecycle.state in ALIVE
        source, telemetry = self.status_source, self.telemetry
        pid = self.lifecycle.pid
        doc, ext, rss, cpu = None, None, None, None
        try:
            if alive and source is not None:
                doc = await source.fetch(max_age)
                ext = source.extensions() if doc is not None else None
            if pid is not None:
                rss, cpu = tree_usage(pid)
        except Exception as exc:  # this engine's figures only; the scrape goes on
            doc = ext = None
            self._limited.log(self._log, "error", "engine_sample_failed",
                              key=type(exc).__name__, error=error_text(exc), exc_info=exc)
        return EngineSample(
            name=self.name,
            state=str(self.lifecycle.state),
            restarts_total=self.lifecycle.restarts,
            exits_total=dict(self.lifecycle.exits),
            start_time_seconds=self.started_at,
            resident_memory_bytes=rss,
            cpu_seconds_total=cpu,
            status=doc,
            extensions=ext,
            fetch_duration_seconds=source.last_fetch_duration_seconds if source else None,
            fetch_errors_total=source.fetch_errors_total if source else 0,
            first_answer_seconds=self.lifecycle.first_answer_seconds if source else None,
            status_field_errors_total=dict(source.field_errors_total) if source else {},
            status_polled=source is not None,
            descendants_killed_total=self._descendants.killed,
            stalls_total=self.stall.stalls_total,
            stalled=self.stall.stalled,
            stop_inflight_partitions_total=dict(self.stop_inflight),
            jobs_lost_total=dict(self.jobs_lost),
            drains_total=dict(self.drains),
            health_loop_failures_total=self.health_loop_failures,
            max_parallel_synthesis=(None if self.spec.cuzk_file is None
                                    else self.spec.cuzk_file.pipeline.max_parallel_synthesis),
            output_dropped_lines_total=self._output_budget.dropped_lines_total,
            output_dropped_bytes_total=self._output_budget.dropped_bytes_total,
            labels=self.labels,
            # a stopping engine's last answer is not what it holds now
            grpc=(telemetry.latest if telemetry is not None
                  and self.lifecycle.state is State.RUNNING else None),
            grpc_polled=telemetry is not None,
            grpc_errors_total=dict(telemetry.errors_total) if telemetry is not None else {},
        )


def _output_limits(spec: EngineConfig) -> OutputLimits:
    """The engine's ``output_*`` keys, as its output budget's limits."""
    return OutputLimits(spec.output_lines_per_second, spec.output_bytes_per_second,
                        spec.output_burst_lines, spec.output_burst_bytes)


def _delay(at: float | None, now: float) -> float | None:
    return None if at is None else max(0.0, at - now)


def _wall(at: float | None, now: float) -> float | None:
    """Unix time of a monotonic instant."""
    return None if at is None else time.time() + (at - now)
