"""The gRPC door's book: which engine gets a call, which calls wait and how long, what each
engine still has in flight, what a lost engine's calls become. Pure: fed ``now``, returns
decisions.

cuzkd stands in the one address Curio dials (docs/supervisor.md, the door) and relays every
call to an engine behind it. While no engine can take a call (starting, restarting, swapping,
in backoff) the call is *held*, within ``hold_max_calls``, ``hold_max_bytes`` and
``hold_timeout``, and released the moment an engine is admitted: CRITICAL first (WinningPoSt
must finish within its epoch), then HIGH, then the rest in arrival order. When the door is full
a call that would be released earlier than some held ones takes the place of the one that
would be released last, so a WinningPoSt is never refused for a crowd of PoReps.

An engine being stopped is no longer *admitting*: it gets no new calls, but an ``AwaitProof``
of a job it holds still goes to it, and its :meth:`DoorBook.in_flight` -- calls sent and not
returned, plus jobs a ``SubmitProof`` gave it that no ``AwaitProof`` has collected -- is what
the stop's ``door`` drain waits to see reach 0: then stopping it throws nothing away.

When an engine's process ends (or the link to it breaks) under a ``Prove`` or ``SubmitProof``,
the call is sent once more -- the same bytes, so the same ``request_id`` -- to another
admitting engine, or held for the engine's next process; a second loss fails it. The shell
keeps a request's bytes for that only when the book says so (:attr:`Send.retain`), within
``retry_max_bytes``. Anything else an engine took with it fails (``engine_lost``), as do the
jobs it had been given: the next process does not know them. A reply, even cuzk's ``FAILED``,
is an ordinary return and never sent again.

Several engines may share a door (one cuzk per GPU): each call goes to the admitting engine
with the fewest in flight, and the reads of the whole engine -- ``GetStatus``, ``GetMetrics``,
``PreloadSRS`` -- go to every admitting one (:class:`Broadcast`), their replies merged by the
shell. While one of them restarts or swaps, the others take every call: none is held.

The shell (:mod:`cuzkd.supervisor.door`) numbers calls, reads the few fields the book needs
from a request (``Call``), carries each decision out and reports back: :meth:`arrived`,
:meth:`returned`, :meth:`admitting`, :meth:`stop_admitting`, :meth:`gone`, :meth:`expired` at
:meth:`next_deadline`, :meth:`shutting_down`. A decision about a call replaces whatever was
under way for it: on a :class:`Send` or :class:`Hold` of a call already sent the shell drops
that attempt and never reports it; a :class:`Refuse` ends the call at its caller (dropping any
attempt). Each :class:`Send` is reported back once, by :meth:`returned`, unless a later
decision replaced it; a held call's caller leaving is ``returned(..., CANCELLED)``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from cuzkd.states import DoorRefusal, DoorRetry

#: The calls that are sent again when their engine is lost: cuzk makes a job of them, keyed by
#: the request's ``request_id``, so the same bytes ask for the same proof.
RETRIABLE = frozenset({"Prove", "SubmitProof"})
#: The calls answered from the door's last good reply when no engine can take them: a
#: monitoring read must not wait for a restart.
FROM_CACHE = frozenset({"GetStatus", "GetMetrics"})
#: The calls about a job, which go to the engine that took its ``SubmitProof``.
FOLLOW_JOB = frozenset({"AwaitProof", "CancelProof"})
#: The calls a door shared by several engines sends to every admitting one, merging their
#: replies: the status and metrics of all of them, an SRS loaded on each.
TO_EVERY = frozenset({"GetStatus", "GetMetrics", "PreloadSRS"})

#: cuzk's ``Priority`` values released ahead of arrival order, first first: CRITICAL, HIGH.
EARLY_PRIORITIES = (4, 3)
#: The longest job id quoted in a refusal's message (ids are the caller's text).
QUOTED_ID = 120


class Outcome(enum.Enum):
    """How a sent call ended, as the shell saw it."""

    #: the engine answered with a reply (whatever its ``status``: cuzk's FAILED included)
    OK = "ok"
    #: the engine answered with a gRPC error status (NOT_FOUND, INVALID_ARGUMENT, ...)
    ERROR = "error"
    #: the caller went away (cancelled, or its deadline passed) before the answer
    CANCELLED = "cancelled"
    #: no answer came from the engine: the connection failed or broke, or what came back was
    #: no gRPC answer -- the engine's process is dying, usually
    BROKEN = "broken"


class Code(enum.StrEnum):
    """The gRPC status of a refusal, by ``grpc.StatusCode`` member name."""

    UNAVAILABLE = "UNAVAILABLE"
    NOT_FOUND = "NOT_FOUND"


@dataclass(frozen=True)
class Call:
    """What the book needs of one call; the shell reads it from the request's bytes."""

    #: the shell's number for it, unique while the call lasts
    id: int
    #: the method's short name: ``Prove``, ``SubmitProof``, ``AwaitProof``, ``GetStatus``, ...
    method: str
    #: the request's size in bytes
    size: int
    #: cuzk's ``Priority`` (0 unspecified .. 4 CRITICAL); any other value ranks as NORMAL
    priority: int = 0
    #: ``Prove``/``SubmitProof``: the ``request_id``; ``AwaitProof``/``CancelProof``: the
    #: ``job_id``; "" when none
    job: str = ""


@dataclass(frozen=True)
class Send:
    """Relay the call to ``engine``.

    ``retain``: keep the request's bytes until the call returns, for a retry; otherwise they
    may go once sent. ``held_for``: seconds the call was held before this (None: never held).
    ``retry``: why this is the call's second sending (None: its first)."""

    call: int
    engine: str
    retain: bool = False
    held_for: float | None = None
    retry: DoorRetry | None = None


@dataclass(frozen=True)
class Hold:
    """Keep the call (and its bytes) waiting; it is released or refused by ``until`` at the
    latest. ``retry``: why a call that was sent is held for its second sending."""

    call: int
    until: float
    retry: DoorRetry | None = None


@dataclass(frozen=True)
class Refuse:
    """End the call at its caller with gRPC status ``code`` and ``message``.
    ``held_for``: seconds it was held first (None: never held)."""

    call: int
    reason: DoorRefusal
    code: Code
    message: str
    held_for: float | None = None


@dataclass(frozen=True)
class FromCache:
    """No engine can take this ``GetStatus``/``GetMetrics`` now (or the one it was sent to was
    lost under it): answer it from the last good reply of one (or with a clear error when there
    is none)."""

    call: int


@dataclass(frozen=True)
class Broadcast:
    """Send the call to each of ``engines`` (every admitting engine of a shared door, in the
    door's order) and answer its caller with their replies merged. The call ends in the book
    here: a status read or an SRS preload is no engine's work in flight (a drain does not wait
    for it; an engine lost under it is left out of the merge). ``held_for`` as for Send."""

    call: int
    engines: tuple[str, ...]
    held_for: float | None = None


@dataclass(frozen=True)
class Withdrawn:
    """The caller of a held call went away after ``held_for`` seconds: nothing to send."""

    call: int
    held_for: float


Decision = Send | Hold | Refuse | FromCache | Broadcast | Withdrawn


@dataclass(frozen=True)
class DoorLimits:
    """A door's bounds (``[door]``, see :class:`cuzkd.config.doors.DoorPlan`)."""

    #: seconds a call may wait for an engine
    hold_timeout: float
    #: calls that may wait at once, and their bytes together
    hold_max_calls: int
    hold_max_bytes: int
    #: bytes of sent Prove/SubmitProof requests kept at once for a retry
    retry_max_bytes: int


@dataclass
class _Seat:
    """One process of an engine behind the door, from its admission to its end."""

    name: str
    #: tells this process from the engine's earlier and later ones
    serial: int
    admitting: bool = True
    #: calls sent to it and not returned
    calls: set[int] = field(default_factory=set)
    #: jobs its SubmitProof replies accepted that no AwaitProof has collected yet
    jobs: set[str] = field(default_factory=set)


@dataclass
class _Job:
    """A job a SubmitProof named: where it is, and the SubmitProofs of it not yet returned."""

    #: the engine that has (or is being sent) it; None while its SubmitProof is held
    engine: str | None
    submits: set[int] = field(default_factory=set)


@dataclass
class _Entry:
    """A call the book has: held, or sent and not returned."""

    call: Call
    #: arrival order, kept when the call is held a second time
    seq: int
    retained: bool = False
    #: sent a second time already (or held for it): it is not sent a third
    retried: bool = False
    #: the engine it is in flight to (None: held)
    engine: str | None = None
    #: while held: since when, and until when at the latest
    held_since: float = 0.0
    until: float = 0.0
    #: the process it must not be sent to again (its link to that one broke)
    not_on: int | None = None
    #: release order: CRITICAL, then HIGH, then the rest; each in arrival order
    order: tuple[int, int] = field(init=False)

    def __post_init__(self) -> None:
        priority = self.call.priority
        rank = (EARLY_PRIORITIES.index(priority) if priority in EARLY_PRIORITIES
                else len(EARLY_PRIORITIES))
        self.order = rank, self.seq


def _quoted(job: str) -> str:
    return repr(job if len(job) <= QUOTED_ID else job[:QUOTED_ID] + "...")


class DoorBook:
    """Every call of one door, from arrival to its end, and the engines behind it.

    Invariants (tests/supervisor/test_doorbook.py): held calls at most ``hold_max_calls``
    and ``hold_max_bytes``; none held past its ``until`` once :meth:`expired` has run then;
    retained bytes at most ``retry_max_bytes``; a call is sent twice at most; every call
    ends exactly once (a return, a refusal, a withdrawal, a cached answer or a broadcast);
    an engine's :meth:`in_flight` is 0 only when all its calls returned and all its jobs
    were collected.
    """

    def __init__(self, *, hold_timeout: float, hold_max_calls: int, hold_max_bytes: int,
                 retry_max_bytes: int, engines: tuple[str, ...] = ()) -> None:
        """``engines``: the door's engines, in its order; when there are several (a shared
        door), the :data:`TO_EVERY` calls are a :class:`Broadcast` to the admitting ones."""
        #: fixed for the book's life: held calls are kept in the order of their deadlines,
        #: which a changed hold_timeout would break (a changed [door] is a new door)
        self.limits = DoorLimits(hold_timeout, hold_max_calls, hold_max_bytes, retry_max_bytes)
        self._shared = engines if len(engines) > 1 else ()
        self._seats: dict[str, _Seat] = {}
        self._entries: dict[int, _Entry] = {}
        self._held: dict[int, _Entry] = {}
        self._jobs: dict[str, _Job] = {}
        self._held_bytes = 0
        self._retained_bytes = 0
        self._arrivals = 0
        self._serials = 0
        self._shutting_down = False

    # -- what the metrics read --------------------------------------------------------------

    @property
    def held_calls(self) -> int:
        """Calls waiting for an engine now."""
        return len(self._held)

    @property
    def held_bytes(self) -> int:
        """The bytes of the calls waiting now."""
        return self._held_bytes

    @property
    def retained_bytes(self) -> int:
        """The bytes of sent requests kept for a retry now."""
        return self._retained_bytes

    def in_flight(self, engine: str) -> int:
        """Calls sent to ``engine``'s process and not returned, plus the jobs it accepted that
        no AwaitProof has collected: 0 when stopping it now loses nothing."""
        seat = self._seats.get(engine)
        return 0 if seat is None else len(seat.calls) + len(seat.jobs)

    def admits(self, engine: str) -> bool:
        """Whether new calls may go to ``engine`` now."""
        seat = self._seats.get(engine)
        return seat is not None and seat.admitting

    def next_deadline(self) -> float | None:
        """When :meth:`expired` next has a held call to refuse (None: nothing held). Calls
        are held in the order of their deadlines (``now`` + one ``hold_timeout``, ``now``
        never going back), so it is the first held one's."""
        first = next(iter(self._held.values()), None)
        return None if first is None else first.until

    # -- engines ----------------------------------------------------------------------------

    def admitting(self, engine: str, now: float) -> list[Decision]:
        """``engine``'s process answered and may take calls: the held calls it can take now,
        released in order (the engine with the fewest in flight takes each). A process that
        ended is reported :meth:`gone` before the engine's next one is admitted."""
        seat = self._seats.get(engine)
        if seat is None:
            self._serials += 1
            seat = self._seats[engine] = _Seat(engine, self._serials)
        seat.admitting = True
        return self._release(now)

    def stop_admitting(self, engine: str) -> None:
        """A stop of ``engine`` began: no new calls to it; AwaitProofs of its jobs still go."""
        seat = self._seats.get(engine)
        if seat is not None:
            seat.admitting = False

    def gone(self, engine: str, now: float, *, crashed: bool) -> list[Decision]:
        """``engine``'s process ended (``crashed``: not at the end of a drained stop). Its
        retained Prove/SubmitProof calls are sent again or held; its other calls are refused,
        and the jobs it had are forgotten (an AwaitProof of one is then ``unknown_job``)."""
        seat = self._seats.pop(engine, None)
        if seat is None:
            return []
        why = DoorRetry.CRASH if crashed else DoorRetry.STOP
        decisions: list[Decision] = []
        for entry in sorted((self._entries[c] for c in seat.calls), key=lambda e: e.seq):
            entry.engine = None
            decisions += self._lost(entry, now, why, engine)
        for job in seat.jobs:  # lost with the process, unless sent again above
            decisions += self._settle_job(job, now)
        return decisions

    # -- calls ------------------------------------------------------------------------------

    def arrived(self, call: Call, now: float) -> list[Decision]:
        """A call came in: the decision about it first, then the refusals of held calls it
        displaced (a full door keeps the calls it would release first)."""
        if call.id in self._entries:
            raise ValueError(f"call {call.id} arrived while a call of that number lasts")
        self._arrivals += 1
        entry = self._entries[call.id] = _Entry(call, self._arrivals)
        if self._shutting_down and self._job_engine(call) is None:
            return self._refuse(entry, now, DoorRefusal.SHUTTING_DOWN,
                                "cuzkd is shutting down: its door takes no new calls")
        return self._place(entry, now, None)

    def returned(self, call_id: int, now: float, outcome: Outcome,
                 job: str = "") -> list[Decision]:
        """Call ``call_id`` ended with ``outcome`` (a held one: ``CANCELLED``, its caller left;
        any other outcome of a held call is of an attempt already replaced). ``job``: the
        ``job_id`` of a SubmitProof's reply, when the request named none (cuzk made one up).
        A broken one is sent again (never to the same process) or held if it was retained,
        else refused."""
        entry = self._entries.get(call_id)
        if entry is None:
            return []
        named = entry.call.job
        if entry.engine is None:
            if outcome is not Outcome.CANCELLED:
                return []  # an attempt the book had already replaced: not this call's end
            held_for = now - entry.held_since
            self._forget(entry)
            return [Withdrawn(call_id, held_for), *self._settle_job(named, now)]
        seat = self._seats[entry.engine]
        if outcome is Outcome.BROKEN:
            seat.calls.discard(call_id)
            entry.engine, entry.not_on = None, seat.serial
            return self._lost(entry, now, DoorRetry.BROKEN, seat.name)
        method = entry.call.method
        if method == "SubmitProof" and outcome is Outcome.OK and (job or named):
            self._accepted(seat, job or named)
        elif method == "AwaitProof" and outcome is not Outcome.CANCELLED:
            seat.jobs.discard(named)  # collected: the engine is done with it
        self._forget(entry)
        return self._settle_job(named, now)

    def expired(self, now: float) -> list[Decision]:
        """The refusals of held calls whose ``until`` has come."""
        message = (f"no engine behind cuzkd's door could take the call within its hold_timeout"
                   f" ({self.limits.hold_timeout:g} s)")
        decisions: list[Decision] = []
        while (first := next(iter(self._held.values()), None)) is not None and first.until <= now:
            decisions += self._refuse(first, now, DoorRefusal.HOLD_TIMEOUT, message)
        return decisions

    def shutting_down(self, now: float) -> list[Decision]:
        """cuzkd's shutdown began: every held call refused now, and every new one on arrival
        but an AwaitProof/CancelProof of a job an engine still has (collecting it is what
        lets that engine's drain end)."""
        self._shutting_down = True
        decisions: list[Decision] = []
        for entry in sorted(self._held.values(), key=lambda e: e.order):
            if entry.call.id in self._held:
                decisions += self._refuse(entry, now, DoorRefusal.SHUTTING_DOWN,
                                          "cuzkd is shutting down: no engine will take the"
                                          " held call")
        return decisions

    # -- the decisions ----------------------------------------------------------------------

    def _job_engine(self, call: Call) -> str | None:
        """The engine a call about a job must go to (None: no engine has that job)."""
        job = self._jobs.get(call.job) if call.method in FOLLOW_JOB else None
        return None if job is None else job.engine

    def _place(self, entry: _Entry, now: float, retry: DoorRetry | None) -> list[Decision]:
        """Send a call that is not held, hold it, or refuse it."""
        call = entry.call
        job = self._jobs.get(call.job)
        if job is not None and (call.method in FOLLOW_JOB or call.method == "SubmitProof"):
            if job.engine is not None:  # a SubmitProof again: cuzk knows the request_id
                return [self._send(entry, job.engine, now, retry)]
            if call.method in FOLLOW_JOB:
                return self._hold(entry, now, retry)  # its SubmitProof is held: it follows
        if job is None and call.method == "AwaitProof":
            return self._refuse(entry, now, DoorRefusal.UNKNOWN_JOB,
                                f"no engine behind cuzkd's door holds job {_quoted(call.job)}",
                                Code.NOT_FOUND)
        if everyone := self._everyone(call):
            return [self._broadcast(entry, everyone, now)]
        engine = self._fewest(entry.not_on)
        if engine is not None:
            return [self._send(entry, engine, now, retry)]
        if call.method in FROM_CACHE:
            del self._entries[call.id]
            return [FromCache(call.id)]
        if self._shutting_down:
            return self._refuse(entry, now, DoorRefusal.SHUTTING_DOWN,
                                "cuzkd is shutting down: no engine will take the call")
        return self._hold(entry, now, retry)

    def _fewest(self, not_on: int | None) -> str | None:
        """The admitting engine with the fewest in flight (by name on a tie), but process
        ``not_on``."""
        seats = [s for s in self._seats.values() if s.admitting and s.serial != not_on]
        best = min(seats, key=lambda s: (len(s.calls) + len(s.jobs), s.name), default=None)
        return None if best is None else best.name

    def _everyone(self, call: Call) -> tuple[str, ...]:
        """The engines a call goes to all of: every admitting one of a shared door for a
        :data:`TO_EVERY` call (empty: it goes to one engine, or waits)."""
        if call.method not in TO_EVERY:
            return ()
        return tuple(name for name in self._shared if self.admits(name))

    def _broadcast(self, entry: _Entry, engines: tuple[str, ...], now: float) -> Broadcast:
        held_for = self._unhold(entry, now)
        self._forget(entry)
        return Broadcast(entry.call.id, engines, held_for)

    def _send(self, entry: _Entry, engine: str, now: float, retry: DoorRetry | None) -> Send:
        call = entry.call
        held_for = self._unhold(entry, now)
        entry.engine = engine
        self._seats[engine].calls.add(call.id)
        if call.method == "SubmitProof" and call.job:
            job = self._jobs.setdefault(call.job, _Job(engine))
            job.engine = engine
            job.submits.add(call.id)
        entry.retained = (call.method in RETRIABLE and not entry.retried
                          and self._retained_bytes + call.size <= self.limits.retry_max_bytes)
        self._retained_bytes += call.size if entry.retained else 0
        return Send(call.id, engine, entry.retained, held_for, retry)

    def _hold(self, entry: _Entry, now: float, retry: DoorRetry | None) -> list[Decision]:
        """Hold a call, displacing the held ones released last (after it) if the door is
        full; refuse it when even that leaves no room."""
        size = entry.call.size
        calls_over = len(self._held) + 1 - self.limits.hold_max_calls
        bytes_over = self._held_bytes + size - self.limits.hold_max_bytes
        later = [] if calls_over <= 0 and bytes_over <= 0 else sorted(
            (e for e in self._held.values() if e.order > entry.order),
            key=lambda e: e.order, reverse=True)
        displaced = 0
        while (calls_over > 0 or bytes_over > 0) and displaced < len(later):
            calls_over -= 1
            bytes_over -= later[displaced].call.size
            displaced += 1
        reason = (DoorRefusal.HOLD_FULL_CALLS if len(self._held) + 1 > self.limits.hold_max_calls
                  else DoorRefusal.HOLD_FULL_BYTES)
        message = (f"no engine behind cuzkd's door can take the call now, and the door is full"
                   f" ({len(self._held)} calls, {self._held_bytes} bytes held; hold_max_calls"
                   f" {self.limits.hold_max_calls}, hold_max_bytes {self.limits.hold_max_bytes})")
        if calls_over > 0 or bytes_over > 0:
            return self._refuse(entry, now, reason, message)
        decisions: list[Decision] = []
        for victim in later[:displaced]:
            decisions += self._refuse(victim, now, reason, message)
        entry.held_since, entry.until = now, now + self.limits.hold_timeout
        self._held[entry.call.id] = entry
        self._held_bytes += size
        if entry.call.method == "SubmitProof" and entry.call.job:  # its awaits wait for it
            self._jobs.setdefault(entry.call.job, _Job(None)).submits.add(entry.call.id)
        return [Hold(entry.call.id, entry.until, retry), *decisions]

    def _release(self, now: float) -> list[Decision]:
        """Send the held calls an admitting engine can take, in release order."""
        decisions: list[Decision] = []
        for entry in sorted(self._held.values(), key=lambda e: e.order):
            if everyone := self._everyone(entry.call):
                decisions.append(self._broadcast(entry, everyone, now))
                continue
            job = self._jobs.get(entry.call.job) if entry.call.method in FOLLOW_JOB else None
            engine = job.engine if job is not None else self._fewest(entry.not_on)
            if engine is not None:
                decisions.append(self._send(entry, engine, now, None))
        return decisions

    def _lost(self, entry: _Entry, now: float, why: DoorRetry,
              engine: str) -> list[Decision]:
        """A sent call's engine is lost: place it again once if it was retained, answer a
        monitoring read from the cache, else refuse."""
        call = entry.call
        if call.method in FROM_CACHE:
            self._forget(entry)
            return [FromCache(call.id)]
        if entry.retained:
            entry.retained, entry.retried = False, True
            self._retained_bytes -= call.size
            job = self._jobs.get(call.job) if call.method == "SubmitProof" else None
            if job is not None and job.engine == engine:
                job.engine = None  # placed anew, not after itself: where it goes, the job goes
                if (seat := self._seats.get(engine)) is not None:
                    seat.jobs.discard(call.job)
            return self._place(entry, now, why)
        if call.method in RETRIABLE and not entry.retried:
            return self._refuse(entry, now, DoorRefusal.RETRY_FULL,
                                f"engine {engine} ended under the call, which was not kept for"
                                f" a retry: it did not fit in retry_max_bytes"
                                f" ({self.limits.retry_max_bytes}) when it was sent")
        again = " again" if entry.retried else ""
        return self._refuse(entry, now, DoorRefusal.ENGINE_LOST,
                            f"engine {engine} ended under the call{again}; cuzkd's door cannot"
                            f" send it again")

    def _refuse(self, entry: _Entry, now: float, reason: DoorRefusal, message: str,
                code: Code = Code.UNAVAILABLE) -> list[Decision]:
        """Refuse a call, then the calls held for its job if that leaves the job nowhere."""
        held_for = self._unhold(entry, now)
        self._forget(entry)
        return [Refuse(entry.call.id, reason, code, message, held_for),
                *self._settle_job(entry.call.job, now)]

    def _unhold(self, entry: _Entry, now: float) -> float | None:
        """Take a call out of the held ones; seconds it was held (None: it was not)."""
        if self._held.pop(entry.call.id, None) is None:
            return None
        self._held_bytes -= entry.call.size
        return now - entry.held_since

    def _forget(self, entry: _Entry) -> None:
        """A call ended: nothing of it stays in the book."""
        call = entry.call
        del self._entries[call.id]
        self._unhold(entry, 0.0)
        if entry.engine is not None:
            self._seats[entry.engine].calls.discard(call.id)
        if entry.retained:
            self._retained_bytes -= call.size
        job = self._jobs.get(call.job) if call.method == "SubmitProof" else None
        if job is not None:
            job.submits.discard(call.id)

    def _accepted(self, seat: _Seat, job_id: str) -> None:
        """A SubmitProof's reply: ``seat`` has the job until an AwaitProof collects it."""
        self._jobs.setdefault(job_id, _Job(seat.name))  # its request named none
        seat.jobs.add(job_id)

    def _settle_job(self, job_id: str, now: float) -> list[Decision]:
        """Forget a job nothing holds any more (no engine has it, no SubmitProof of it is on
        the way); the calls held for it are refused."""
        job = self._jobs.get(job_id)
        if job is None or job.submits:
            return []
        seat = self._seats.get(job.engine) if job.engine is not None else None
        if seat is not None and job_id in seat.jobs:
            return []
        del self._jobs[job_id]
        decisions: list[Decision] = []
        for entry in [e for e in self._held.values() if e.call.method in FOLLOW_JOB
                      and e.call.job == job_id]:
            decisions += self._refuse(entry, now, DoorRefusal.UNKNOWN_JOB,
                                      f"job {_quoted(job_id)} was not accepted by an engine"
                                      f" behind cuzkd's door", Code.NOT_FOUND)
        return decisions
