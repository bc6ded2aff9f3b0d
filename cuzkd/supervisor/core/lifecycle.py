"""One engine's process lifecycle as a pure state machine.

The I/O shell (:mod:`cuzkd.supervisor.engines.runner`) feeds it events -- the process was spawned,
a status poll answered or not, the process exited, an operator asked for stop/start/restart, a
backoff timer fired -- with the current monotonic time, and executes the actions it returns:
every event returns a list of them (empty: nothing to do), so the shell handles each alike.
Nothing here touches processes, clocks or the event loop, so every rule (restart policy,
backoff, hung-engine detection, exit accounting) is unit-tested directly with a fake clock.

States (:class:`cuzkd.states.State`): ``starting`` (spawned, status not answered yet) →
``running`` (status answered) → ``stopping`` (stop signal sent) → ``stopped``; ``backoff``
(waiting to restart after a failure); ``failed`` (will not restart on its own: restart policy,
or the command cannot be spawned).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from cuzkd.config.schema import Restart
from cuzkd.states import (
    ALIVE,
    AT_REST,
    OPERATOR_STOPS,
    STOP_EXIT_CAUSES,
    ExitCause,
    State,
    StopReason,
)
from cuzkd.supervisor.core.backoff import Backoff
from cuzkd.supervisor.core.exitcause import DAEMONIZED_ERROR
from cuzkd.supervisor.core.handover import LifecycleState


@dataclass(frozen=True)
class Spawn:
    """Start a new process now, then report ``spawned`` or ``spawn_failed``."""


@dataclass(frozen=True)
class Stop:
    """The stop sequence: drain (``drain``: the engine answered and was asked to stop, so its
    in-flight work may end first), the stop signal, SIGKILL of the process group after
    stop_timeout; report ``exited``. ``kill``: SIGKILL at once (a stalled engine has nothing
    left to drain, a broken one nothing worth draining), ``why`` says why in the kill's log.
    ``reason``: why the supervisor stops it; ``within``: seconds the whole stop may take (a
    shutdown's grace; None: its own budget)."""

    kill: bool = False
    drain: bool = False
    why: str = ""
    reason: StopReason = StopReason.OPERATOR
    within: float | None = None


@dataclass(frozen=True)
class ScheduleStart:
    """Report ``backoff_elapsed`` after ``delay`` seconds."""

    delay: float


@dataclass(frozen=True)
class CancelScheduledStart:
    """Drop a pending ScheduleStart timer."""


Action = Spawn | Stop | ScheduleStart | CancelScheduledStart


@dataclass(frozen=True)
class Policy:
    restart: Restart
    start_timeout: float
    unhealthy_after: float


@dataclass(frozen=True)
class Transition:
    """What one event did, for the structured log (one event per state change)."""

    old: State
    new: State
    reason: str


@dataclass
class Lifecycle:
    policy: Policy
    backoff: Backoff
    state: State = State.STOPPED
    pid: int | None = None
    #: monotonic time of the current process's spawn / first healthy answer / last answer
    spawned_at: float | None = None
    healthy_since: float | None = None
    last_ok: float | None = None
    #: monotonic time the pending backoff timer fires
    next_start_at: float | None = None
    restarts: int = 0
    #: exit cause (:mod:`~cuzkd.supervisor.core.exitcause`: ``stopped``, ``exit_1``, ...) -> count
    exits: Counter[str] = field(default_factory=Counter)
    last_exit_cause: str | None = None
    last_error: str | None = None
    #: seconds from the spawn to the first status answer, of the last process that answered
    #: (kept through its restarts until the next one answers; None before any answered)
    first_answer_seconds: float | None = None
    #: why the process being stopped is stopped (None: no stop of the supervisor's)
    _stop_reason: StopReason | None = None
    #: a spawn follows its exit at once, whatever the restart policy (a restart, a swap)
    _restart_after_stop: bool = False
    #: the process's exit is the last thing that happened: what it said it died of, read
    #: later (:meth:`exit_explained`), is still the engine's latest error
    _exit_unexplained: bool = False
    _started_once: bool = False
    #: transitions since the shell last called take_transitions() (it logs and clears them)
    _transitions: list[Transition] = field(default_factory=list)

    # -- operator requests -------------------------------------------------------------

    def start_requested(self, now: float) -> list[Action]:
        del now
        if self.state in AT_REST:
            return [Spawn()]
        if self.state is State.BACKOFF:
            return [CancelScheduledStart(), Spawn()]
        if self.state is State.STOPPING:
            self._stopping_for(StopReason.OPERATOR, restart=True)
        return []

    def stop_requested(self, now: float, reason: StopReason = StopReason.OPERATOR, *,
                       within: float | None = None) -> list[Action]:
        """Stop for ``reason``; ``within``: seconds the whole stop may take (a shutdown's
        grace: the drain gets what it leaves after stop_timeout)."""
        del now
        if self.state in ALIVE:
            self._stopping_for(reason, restart=False)
            return self._stop(reason, "stop requested", within)
        if self.state is State.BACKOFF:
            self.next_start_at = None
            self._move(State.STOPPED, "stop requested")
            return [CancelScheduledStart()]
        if self.state is State.STOPPING:
            self._stopping_for(reason, restart=False)
        return []

    def restart_requested(self, now: float, *, swap: bool = False) -> list[Action]:
        """Graceful stop then start; ``swap``: for a binary swap (exit cause ``swap``, else
        ``stopped``)."""
        reason = StopReason.SWAP if swap else StopReason.OPERATOR
        if self.state in ALIVE:
            self._stopping_for(reason, restart=True)
            return self._stop(reason, "swap restart" if swap else "restart requested")
        if self.state is State.STOPPING:
            self._stopping_for(reason, restart=True)
            return []
        return self.start_requested(now)

    # -- process events ----------------------------------------------------------------

    def spawned(self, pid: int, now: float) -> list[Action]:
        if self._started_once:
            self.restarts += 1
        self._started_once = True
        self.pid = pid
        self.spawned_at = now
        self.healthy_since = None
        self.last_ok = None
        self.next_start_at = None
        self.last_error = None
        self._stopping_for(None, restart=False)
        self._exit_unexplained = False
        self._move(State.STARTING, "spawned")
        return []

    def spawn_failed(self, error: str, now: float, *, transient: bool = False) -> list[Action]:
        """The spawn raised. A ``transient`` error (descriptors or memory short for a moment)
        is retried through the backoff like a crash; any other leaves the engine ``failed``
        until an operator starts it again."""
        self.pid = None
        self.last_error = error
        self._exit_unexplained = False
        if not transient:
            self._move(State.FAILED, f"spawn failed: {error}")
            return []
        delay = self.backoff.next_delay(None)
        if delay <= 0:
            return [Spawn()]
        self.next_start_at = now + delay
        self._move(State.BACKOFF, f"spawn failed: {error}, retrying in {delay:.3f}s")
        return [ScheduleStart(delay)]

    def poll(self, now: float, ok: bool, error: str | None = None, *,
             fresh: bool = True, answered: bool = False) -> list[Action]:
        """A status poll finished (``ok``: a valid document came back; else ``error`` says
        why). The error is kept as ``last_error`` until a poll succeeds or the next spawn, and a
        kill for silence names it: an engine killed for its status never reports only "silent".
        A failed poll that is not ``fresh`` -- the supervisor was frozen for much of it (see
        :mod:`~cuzkd.supervisor.engines.runclock`): its timeout ran out while nothing read the
        reply -- says nothing about the engine and never leads to a kill; polls made after the
        supervisor runs again do. ``answered``: the engine answered with a document cuzkd does
        not take whole (larger than it reads: a cuzk whose failed jobs stay listed for good
        grows one): it is alive and serving, so not unhealthy -- the error is reported, never
        a kill."""
        if self.state not in ALIVE:
            return []
        if not ok and not fresh:
            return []
        if ok or answered:
            self.last_ok = now
            self.last_error = None if ok else error
            if self.state is State.STARTING:
                self.healthy_since = now
                if self.spawned_at is not None:
                    self.first_answer_seconds = now - self.spawned_at
                self._move(State.RUNNING, "status answered")
            return []
        if error:
            self.last_error = error
        why = f" (last error: {self.last_error})" if self.last_error else ""
        if self.state is State.STARTING:
            assert self.spawned_at is not None
            if now - self.spawned_at >= self.policy.start_timeout:
                return self._kill(StopReason.START_TIMEOUT,
                                  f"status did not answer within start_timeout{why}")
        elif self.last_ok is not None and now - self.last_ok >= self.policy.unhealthy_after:
            return self._kill(StopReason.UNHEALTHY, f"status silent for unhealthy_after{why}")
        return []

    def in_start(self, now: float) -> bool:
        """A status poll that nothing answers now is the engine's start, not a fault: its
        process has not answered yet and its start_timeout has not run out. Such failures
        are not counted (``cuzkd_status_fetch_errors_total``) nor logged as failures: every
        engine fails the polls before its listener is up, and a slow starter (cuzk) fails a
        hundred. (A wrong answer is a fault even now: the status source counts it.) While the
        spawn itself waits (leftovers, GPU memory) no process exists to answer a scrape's
        fetch: that is the start too."""
        return self.state is State.STARTING and (
            self.spawned_at is None or now - self.spawned_at < self.policy.start_timeout)

    def settled(self, now: float) -> list[Action]:
        """An engine without a status URL stayed alive through its settle time: it counts as
        running (and healthy, for the backoff reset) from now on, like supervisord's
        ``startsecs``."""
        if self.state is State.STARTING:
            self.healthy_since = self.last_ok = now
            self._move(State.RUNNING, "process alive through its settle time")
        return []

    def spawn_waiting(self, reason: str) -> list[Action]:
        """A spawn waits (for the previous process's leftovers, for GPU memory): ``starting``
        without a process, so the engine never reads as running while nothing runs."""
        self.pid = None
        self.next_start_at = None
        self._exit_unexplained = False
        if self.state is not State.STARTING:
            self._move(State.STARTING, reason)
        return []

    def spawn_abandoned(self, now: float) -> list[Action]:
        """A spawn still waiting (leftovers, GPU memory) was given up because a stop came."""
        del now
        self.pid = None
        self.next_start_at = None
        self._stopping_for(None, restart=False)
        if self.state is not State.STOPPED:
            self._move(State.STOPPED, "stop requested while waiting to spawn")
        return []

    def stalled(self, now: float) -> list[Action]:
        """The stall watchdog fired with ``stall_action = "restart"``: SIGKILL, then a restart
        whatever the restart policy, through the backoff as after a crash (an engine that
        stalls again at once must not cycle CUDA contexts and parameter loads flat out)."""
        del now
        if self.state is not State.RUNNING:
            return []
        self._stopping_for(StopReason.STALL, restart=False)
        self._move(State.STOPPING, "stalled: work and no progress")
        return [Stop(kill=True, why="stalled", reason=StopReason.STALL)]

    def answers_broken(self, now: float, error: str) -> list[Action]:
        """The front door found the engine's gRPC answers are not cuzk's messages (``error``
        says how): it is unhealthy, whatever its status says. SIGKILL without a drain -- the
        door retries its calls elsewhere, and a drain would wait on a process that answers
        garbage -- then a restart through the backoff, counted ``unhealthy``."""
        del now
        if self.state is not State.RUNNING:
            return []
        self.last_error = error
        self._stopping_for(StopReason.UNHEALTHY, restart=False)
        self._move(State.STOPPING, f"answers broken: {error}")
        return [Stop(kill=True, why="answers_broken", reason=StopReason.UNHEALTHY)]

    def exited(self, cause: str, clean: bool, now: float) -> list[Action]:
        """The process is gone. ``cause``: what it died of (``exit_N``, ``signal_NAME``,
        ``oom_killed``, ``core_dumped``); ``clean``: exit 0. The supervisor's stop reason, if it
        stopped the process, takes precedence as the counted cause."""
        reason, restart = self._stop_reason, self._restart_after_stop
        self._stopping_for(None, restart=False)
        healthy_for = now - self.healthy_since if self.healthy_since is not None else None
        self.pid = None
        self.spawned_at = None
        self.healthy_since = None
        if reason is not None:
            cause, clean = STOP_EXIT_CAUSES[reason], False
        if cause == ExitCause.DAEMONIZED:  # the one exit whose cause says what to change
            self.last_error = DAEMONIZED_ERROR
        self.exits[cause] += 1
        self.last_exit_cause = cause
        self._exit_unexplained = True
        if restart:
            return [Spawn()]
        if reason in OPERATOR_STOPS:
            self._move(State.STOPPED, f"stopped ({cause})")
            return []
        wants_restart = reason is StopReason.STALL or self.policy.restart == Restart.ALWAYS or (
            self.policy.restart == Restart.ON_FAILURE and not clean
        )
        if not wants_restart:
            self._move(State.STOPPED if clean else State.FAILED, f"exited ({cause}), "
                                                                 f"restart={self.policy.restart}")
            return []
        delay = self.backoff.next_delay(healthy_for)
        if delay <= 0:
            return [Spawn()]
        self.next_start_at = now + delay
        self._move(State.BACKOFF, f"exited ({cause}), restarting in {delay:.3f}s")
        return [ScheduleStart(delay)]

    def exit_explained(self, error: str) -> list[Action]:
        """What the process that exited last said it died of (a cuzk panic, its ``Error:``
        line), read from its stderr once the exit was reaped: ``last_error`` until the next
        spawn. Dropped when a spawn, or an attempt at one, came first: the new process's errors
        are the current ones (the exit's log event still names it)."""
        if self._exit_unexplained:
            self._exit_unexplained = False
            self.last_error = error
        return []

    def backoff_elapsed(self, now: float) -> list[Action]:
        del now
        if self.state is not State.BACKOFF:
            return []
        return [Spawn()]

    # -- cuzkd upgrade -----------------------------------------------------------------

    def handover(self) -> LifecycleState:
        """Everything this machine knows, for the program that replaces the supervisor; only
        taken at rest or running (:mod:`~cuzkd.supervisor.core.upgradegate`): no stop is
        under way."""
        assert self._stop_reason is None and not self._restart_after_stop
        return LifecycleState(
            state=self.state.value, pid=self.pid, spawned_at=self.spawned_at,
            healthy_since=self.healthy_since, last_ok=self.last_ok,
            next_start_at=self.next_start_at, restarts=self.restarts, exits=dict(self.exits),
            last_exit_cause=self.last_exit_cause, last_error=self.last_error,
            first_answer_seconds=self.first_answer_seconds, started_once=self._started_once,
            exit_unexplained=self._exit_unexplained, backoff_failures=self.backoff.failures)

    def adopt(self, handed: LifecycleState, now: float) -> list[Action]:
        """Carry on from ``handed`` (:meth:`handover` of the old code); the action that
        continues it: a backoff's timer for what is left of it at ``now``."""
        self.state = State(handed.state)
        self.pid, self.spawned_at = handed.pid, handed.spawned_at
        self.healthy_since, self.last_ok = handed.healthy_since, handed.last_ok
        self.next_start_at = handed.next_start_at
        self.restarts, self.exits = handed.restarts, Counter(handed.exits)
        self.last_exit_cause, self.last_error = handed.last_exit_cause, handed.last_error
        self.first_answer_seconds = handed.first_answer_seconds
        self._started_once, self._exit_unexplained = handed.started_once, handed.exit_unexplained
        self.backoff.failures = handed.backoff_failures
        if self.state is State.BACKOFF and self.next_start_at is not None:
            return [ScheduleStart(max(0.0, self.next_start_at - now))]
        return []

    def take_transitions(self) -> list[Transition]:
        taken, self._transitions = self._transitions, []
        return taken

    # -- internals ---------------------------------------------------------------------

    def _stopping_for(self, reason: StopReason | None, *, restart: bool) -> None:
        """Why the process is stopped (None: it is not) and whether a spawn follows at once."""
        self._stop_reason, self._restart_after_stop = reason, restart

    def _stop(self, reason: StopReason, transition: str,
              within: float | None = None) -> list[Action]:
        """A requested stop: drained when the engine is up (a starting one has no work)."""
        drain = self.state is State.RUNNING
        self._move(State.STOPPING, transition)
        return [Stop(drain=drain, reason=reason, within=within)]

    def _kill(self, reason: StopReason, transition: str) -> list[Action]:
        self._stopping_for(reason, restart=False)
        self._move(State.STOPPING, transition)
        return [Stop(reason=reason)]

    def _move(self, new: State, reason: str) -> None:
        self._transitions.append(Transition(self.state, new, reason))
        self.state = new
