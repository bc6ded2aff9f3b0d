"""One engine's stop sequence as a pure state object fed ``now``: drain, stop signal, SIGKILL.

The sequence (docs/supervisor.md): let in-flight work end within ``drain_timeout`` -- ``http``
asks the engine to drain and waits for it to exit, ``quiet`` waits for a status with no
partition synthesizing or on a GPU, ``cuzk`` for one with no job held (``/status`` and
``GetStatus``), ``door`` for the front door to hold no call or job of the engine --
then the stop signal to the process group, then SIGKILL after
``stop_timeout``. A stalled engine skips to SIGKILL (it has nothing left to drain). A stop that
must end within a bound (a shutdown's ``shutdown_grace``) drains for what the bound leaves
after ``stop_timeout``: the grace bounds everything, and the stop signal still gets its time.

Every rule of it -- which deadline applies, when the status is read, which signal counts as the
one that throws work away, how a drain is judged -- is decided here from values. The stopper
(:meth:`~cuzkd.supervisor.engines.stopper.EngineStopper.run`) is a loop that asks
:meth:`step` what to do, does it, and reports back; so each branch is tested with plain
numbers and the runner's own tests only need to show that the loop carries steps out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cuzkd.config.schema import DrainMode
from cuzkd.states import OPERATOR_STOPS, DrainResult, StopReason

#: Longest pause between two status reads while a drain waits (the health interval, if shorter).
DRAIN_POLL = 0.5
#: Drain modes that end on status reads showing a quiet moment (``http`` ends on the exit), and
#: how many reads in a row must show it. cuzk's: two, a read apart -- a job that has just
#: finished is off its queues before its ``Prove`` reply (the proof) has left for the client,
#: and a stop signal in between would throw the finished proof away. ``door``'s: one -- the
#: door's count of calls in flight drops only once the engine's reply is in the door's hands.
QUIET_READS = {DrainMode.QUIET: 1, DrainMode.CUZK: 2, DrainMode.DOOR: 1}


def drain_budget(drain_timeout: float, stop_timeout: float, within: float | None) -> float:
    """How long a stop may drain: ``drain_timeout``, or less when the whole stop must end
    ``within`` seconds -- what is left of that after ``stop_timeout`` (never below 0)."""
    if within is None:
        return drain_timeout
    return max(0.0, min(drain_timeout, within - stop_timeout))


@dataclass(frozen=True)
class RequestDrain:
    """Ask the engine to drain (``POST /v1/drain``); report :meth:`StopSequence.drain_answered`.
    ``by``: the drain's deadline, which a request still unanswered then must not outlast (it
    counts as refused)."""

    by: float


@dataclass(frozen=True)
class ReadStatus:
    """Read the engine's status now; report :meth:`StopSequence.status_read`. ``by``: the
    drain's deadline, which a read still unanswered then must not outlast (no quiet seen):
    a hung status must not stretch the stop past drain_timeout + stop_timeout."""

    by: float


@dataclass(frozen=True)
class DrainOver:
    """The drain has ended with ``result`` (``clean`` or ``timeout``) after ``seconds``."""

    result: DrainResult
    seconds: float


@dataclass(frozen=True)
class SendSignal:
    """Signal the process group: SIGKILL when ``kill``, else the engine's stop signal.

    ``ends_work``: the first signal of the sequence -- what is in flight now is what the stop
    throws away (counted once). ``why``: a SIGKILL's reason, for the log.
    """

    kill: bool
    ends_work: bool
    why: str = ""


@dataclass(frozen=True)
class WaitUntil:
    """Wait for the process to exit, or until the monotonic time ``at``; then step again."""

    at: float


@dataclass(frozen=True)
class Finished:
    """Nothing more to do: the process exited, or the last signal (SIGKILL) is sent."""


Step = RequestDrain | ReadStatus | DrainOver | SendSignal | WaitUntil | Finished


class Stage(enum.Enum):
    """Where one stop sequence stands; each stage ends by itself at the sequence's deadline."""

    DRAINING = "draining"
    SIGNAL_DUE = "signal_due"
    SIGNALLED = "signalled"
    KILL_DUE = "kill_due"
    DONE = "done"


@dataclass
class StopSequence:
    """What one stop does next; build it with :meth:`begin`."""

    #: the engine's, or ``none`` when this stop skips the drain
    drain_mode: DrainMode
    drain_timeout: float
    stop_timeout: float
    #: seconds between two status reads while draining
    read_every: float
    stage: Stage
    #: when the current stage ends by itself (drain_timeout, then stop_timeout)
    deadline: float
    started: float
    #: why a SIGKILL due at once is sent (``stalled``)
    kill_reason: str = ""
    drain_requested: bool = False
    next_read: float = 0.0
    quiet_seen: bool = False
    #: status reads in a row that showed the quiet moment
    quiet_reads: int = 0

    @classmethod
    def begin(cls, now: float, *, drain_mode: DrainMode, drain_timeout: float,
              stop_timeout: float, health_interval: float, kill_reason: str | None = None,
              within: float | None = None) -> StopSequence:
        """A stop starting at ``now``. ``drain_mode`` ``none`` skips the drain (the engine's
        setting, or a stop of an engine whose status never answered); ``kill_reason``: SIGKILL
        at once, for that reason; ``within``: seconds the whole stop may take (see
        :func:`drain_budget`)."""
        drain_timeout = drain_budget(drain_timeout, stop_timeout, within)
        if kill_reason is not None:
            stage, deadline = Stage.KILL_DUE, now
        elif drain_mode != DrainMode.NONE:
            stage, deadline = Stage.DRAINING, now + drain_timeout
        else:
            stage, deadline = Stage.SIGNAL_DUE, now
        return cls(drain_mode, drain_timeout, stop_timeout, min(health_interval, DRAIN_POLL),
                   stage, deadline, now, kill_reason or "", next_read=now)

    @property
    def draining(self) -> bool:
        return self.stage is Stage.DRAINING

    def deadline_work_window(self, now: float, reason: StopReason) -> float | None:
        """Seconds this stop's drain leaves for deadline calls (a WinningPoSt no other engine
        can take goes to the draining engine rather than wait behind the drain): the drain's
        rest, for an operator's stop that drains; None for a stop closed to them -- a health
        or stall kill, broken answers -- whose engine is not to be trusted with them."""
        if not self.draining or reason not in OPERATOR_STOPS:
            return None
        return max(0.0, self.deadline - now)

    def drain_answered(self, accepted: bool) -> None:
        """The drain request's answer: one refused ends the drain (no result is counted) and
        the stop signal is due at once."""
        if not accepted and self.stage is Stage.DRAINING:
            self.stage = Stage.SIGNAL_DUE

    def status_read(self, quiet: bool) -> None:
        """A status read while draining; ``quiet``: it showed the quiet moment the drain mode
        waits for (``quiet``, ``cuzk``: see :data:`QUIET_READS`; an ``http`` drain ends when
        the engine exits)."""
        needed = QUIET_READS.get(self.drain_mode)
        self.quiet_reads = self.quiet_reads + 1 if quiet else 0
        self.quiet_seen = self.quiet_seen or (needed is not None and self.quiet_reads >= needed)

    def step(self, now: float, *, exited: bool, killed: bool = False) -> Step:
        """What to do at ``now``. ``exited``: the process is gone; ``killed``: someone
        (a hurried shutdown) SIGKILLed it meanwhile, so a drain it ended in is no clean one."""
        match self.stage:
            case Stage.DRAINING:
                return self._drain_step(now, exited, killed)
            case Stage.KILL_DUE:
                if exited:  # gone before the stop began: nothing to kill, no work lost
                    return self._finish()
                self.stage = Stage.DONE
                return SendSignal(kill=True, ends_work=True, why=self.kill_reason)
            case Stage.SIGNAL_DUE:
                if exited:
                    return self._finish()
                self.stage, self.deadline = Stage.SIGNALLED, now + self.stop_timeout
                return SendSignal(kill=False, ends_work=True)
            case Stage.SIGNALLED:
                if exited:
                    return self._finish()
                if now >= self.deadline:
                    self.stage = Stage.DONE
                    return SendSignal(kill=True, ends_work=False, why="stop_timeout elapsed")
                return WaitUntil(self.deadline)
        return Finished()

    def _drain_step(self, now: float, exited: bool, killed: bool) -> Step:
        if self.drain_mode == DrainMode.HTTP and not self.drain_requested:
            self.drain_requested = True
            return RequestDrain(by=self.deadline)
        if exited or self.quiet_seen or now >= self.deadline:
            clean = not killed if exited else self.quiet_seen
            self.stage = Stage.DONE if exited else Stage.SIGNAL_DUE
            return DrainOver(DrainResult.CLEAN if clean else DrainResult.TIMEOUT,
                             now - self.started)
        if now >= self.next_read:
            self.next_read = now + self.read_every
            return ReadStatus(by=self.deadline)
        return WaitUntil(min(self.next_read, self.deadline))

    def _finish(self) -> Finished:
        self.stage = Stage.DONE
        return Finished()
