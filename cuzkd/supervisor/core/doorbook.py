"""The gRPC door's book: which engine gets a call, which calls wait and how long, what each
engine still has in flight, and what a lost engine's calls become.

:class:`DoorBook` is pure, fed ``now`` and returning decisions (:class:`Send`, :class:`Hold`,
:class:`Refuse`, :class:`Broadcast`, :class:`Join`, :class:`Echo`, ...), so every rule a caller
relies on is tested on plain values; the shell in :mod:`cuzkd.supervisor.door` relays the bytes
and carries the decisions out. What the rules promise each call is docs/door.md, *What it
promises each call*; how they are decided is *The book's decisions: held calls, in flight, one
retry* there.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from cuzkd.cuzk.reading import QueueReading
from cuzkd.kinds import ProofKind
from cuzkd.priority import Priority
from cuzkd.states import DoorAbandon, DoorRefusal, DoorRetry

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

#: The kinds cuzk proves whole and queues for its GPUs under one key (job 0, partition 0).
POST_KINDS = frozenset({ProofKind.WINNING_POST, ProofKind.WINDOW_POST})
#: The kinds cuzk splits into partitions, listed in ``/status`` once dispatched.
PARTITIONED_KINDS = frozenset({ProofKind.POREP_C2, ProofKind.SNAP_UPDATE})
#: A call's place by kind, as Curio sends them; every other call comes after these.
KIND_PLACES: Mapping[str, int] = {ProofKind.WINNING_POST: 0, ProofKind.WINDOW_POST: 1}
LAST_KIND_PLACE = 2
#: The place each claimed priority takes. A claim only lowers a call's place
#: (PRIORITY_UNSPECIFIED claims nothing; an unknown value is NORMAL).
CLAIMED_PLACES: Mapping[int, int] = {Priority.CRITICAL: 0, Priority.HIGH: 1, Priority.NORMAL: 2,
                                     Priority.LOW: 3}
#: Readings in a row that must not show a call before a drain stops waiting for it: a job that
#: just moved between cuzk's scheduler and its tracker is shown by neither for a moment.
UNSEEN_READS = 2
#: How long after a job a ``SubmitProof`` gave an engine is last shown a drain still waits
#: for its ``AwaitProof`` (cuzk keeps a finished job's result for its collector).
JOB_GRACE = 5.0
#: Request ids quarantined at once, at most (the first to end their quarantine leave first).
MAX_QUARANTINED = 1024
#: The longest job id quoted in a refusal's message (ids are the caller's text).
QUOTED_ID = 120


class Outcome(enum.Enum):
    """How a sent call ended, as the shell saw it."""

    #: the engine answered with a reply (whatever its ``status``: cuzk's FAILED included)
    OK = "ok"
    #: the engine answered with a gRPC error status (NOT_FOUND, INVALID_ARGUMENT, ... and an
    #: UNAVAILABLE its live process sent itself)
    ERROR = "error"
    #: the caller went away (cancelled, or its deadline passed) before the answer
    CANCELLED = "cancelled"
    #: no answer came from the engine: the connection failed or broke and did not come back,
    #: or what came back was no gRPC answer -- the engine's process is dying, usually
    BROKEN = "broken"


class Code(enum.StrEnum):
    """The gRPC status of a refusal, by ``grpc.StatusCode`` member name."""

    UNAVAILABLE = "UNAVAILABLE"
    NOT_FOUND = "NOT_FOUND"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ALREADY_EXISTS = "ALREADY_EXISTS"


#: The code each refusal reason answers with (docs/door.md lists them for callers).
REFUSAL_CODES: Mapping[DoorRefusal, Code] = {
    **{reason: Code.UNAVAILABLE for reason in DoorRefusal},
    DoorRefusal.UNKNOWN_JOB: Code.NOT_FOUND,
    DoorRefusal.DEADLINE: Code.DEADLINE_EXCEEDED,
    DoorRefusal.QUARANTINED: Code.FAILED_PRECONDITION,
    DoorRefusal.ALREADY_EXISTS: Code.ALREADY_EXISTS,
}


class EngineEnd(enum.Enum):
    """How an engine's process ended, as the door needs to know it."""

    #: a stop that drained: nothing the door waited for was in flight (abandoned work may be)
    DRAINED = "drained"
    #: cuzkd ended it otherwise: a drain that ran out, a stall or health kill, broken answers
    STOPPED = "stopped"
    #: the kernel's OOM killer: memory, not a request, is to blame
    OOM_KILLED = "oom_killed"
    #: an exit nobody asked for: a panic, a signal, an error exit
    CRASHED = "crashed"


class HoldCause(enum.Enum):
    """Why a call is held."""

    #: no engine can take it now (none admits, or none that may)
    NO_ENGINE = "no_engine"
    #: its engine has a PoSt in flight, or a fresh process's first partitioned job, and gets
    #: one PoSt at a time
    POST_IN_FLIGHT = "post_in_flight"
    #: a suspect waiting for the engine's other suspect to end
    SUSPECT = "suspect"


@dataclass(frozen=True)
class Call:
    """What the book needs of one call; the shell reads it from the request's bytes."""

    #: the shell's number for it, unique while the call lasts
    id: int
    #: the method's short name: ``Prove``, ``SubmitProof``, ``AwaitProof``, ``GetStatus``, ...
    method: str
    #: the request's size in bytes
    size: int
    #: cuzk's :class:`~cuzkd.priority.Priority` as the request carries it; any number the enum
    #: does not have ranks as NORMAL
    priority: int = Priority.PRIORITY_UNSPECIFIED
    #: ``Prove``/``SubmitProof``: the ``request_id``; ``AwaitProof``/``CancelProof``: the
    #: ``job_id``; "" when none
    job: str = ""
    #: ``Prove``/``SubmitProof``: the proof kind, cuzk's name (``winning-post``); "" when none
    kind: str = ""
    #: seconds the caller's own gRPC deadline left at arrival (None: it set none)
    timeout: float | None = None
    #: the request's bytes (``Prove``/``SubmitProof``), to tell the same call sent twice from
    #: another with the same ``request_id``
    request: bytes = field(default=b"", compare=False, repr=False)


@dataclass(frozen=True)
class EngineReading:
    """What one read of an engine showed of the work it holds (the runner's, while it drains
    or while the book :meth:`~DoorBook.wants_reading`)."""

    #: the ids ``/status`` lists (jobs in flight, failed, or finished < 30 s ago); None: none read
    jobs: frozenset[str] | None = None
    #: the listed jobs whose partition 0 has left cuzk's GPU queue (on a GPU, done or failed)
    past_gpu_queue: frozenset[str] = frozenset()
    #: its ``GetStatus`` queues (None: not read)
    queues: QueueReading | None = None


@dataclass(frozen=True)
class Send:
    """Relay the call to ``engine``.

    ``retain``: keep the request's bytes until the call returns, for a retry; otherwise they
    may go once sent. ``held_for``: seconds the call was held before this (None: never held).
    ``retry``: why this is the call's second sending (None: its first). ``serialized``: it
    was held waiting for the engine's PoSt slot."""

    call: int
    engine: str
    retain: bool = False
    held_for: float | None = None
    retry: DoorRetry | None = None
    serialized: bool = False


@dataclass(frozen=True)
class Hold:
    """Keep the call (and its bytes) waiting; it is released or refused by ``until`` at the
    latest (a deadline call: by its last moment to be sent). ``retry``: why a call that was
    sent is held for its second sending."""

    call: int
    until: float
    retry: DoorRetry | None = None
    cause: HoldCause = HoldCause.NO_ENGINE


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


@dataclass(frozen=True)
class Join:
    """The same call as ``leader`` (its ``request_id``, its bytes) is in flight: wait for its
    answer (an :class:`Echo`, or the refusal it gets)."""

    call: int
    leader: int


@dataclass(frozen=True)
class Echo:
    """Answer the call with ``leader``'s answer (the engine's reply or gRPC error): it ends."""

    call: int
    leader: int


@dataclass(frozen=True)
class Abandoned:
    """A drain of ``engine`` stopped waiting for the call (or, ``call`` None, the job ``job``):
    the engine shows it no longer has it. Nothing to do with the call; it stays where it is."""

    call: int | None
    engine: str
    reason: DoorAbandon
    job: str = ""


@dataclass(frozen=True)
class Quarantined:
    """``job`` (a request id) is quarantined until ``until``: ``engine`` crashed twice with the
    call in flight, alone among suspects the second time. The call itself is refused."""

    call: int
    job: str
    engine: str
    until: float


Decision = (Send | Hold | Refuse | FromCache | Broadcast | Withdrawn | Join | Echo | Abandoned
            | Quarantined)


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


@dataclass(frozen=True)
class DoorRules:
    """What a door decides by besides its bounds (``[metrics] proof_deadlines``, ``[door]``,
    each engine's ``one_post``)."""

    #: proof kind -> seconds from a call's arrival to its deadline (the kinds with deadlines)
    deadlines: Mapping[str, float] = field(default_factory=dict)
    #: proof kind -> seconds proving one may take (a deadline call must be sent by its
    #: deadline less this)
    allowances: Mapping[str, float] = field(default_factory=dict)
    #: seconds a poison request's id stays quarantined
    quarantine: float = 3600.0
    #: the engines sent one PoSt at a time (cuzk's overwrite)
    one_post: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Quarantine:
    """One quarantined request id: which engine it crashed, since and until when."""

    job: str
    engine: str
    since: float
    until: float


@dataclass
class _Seat:
    """One process of an engine behind the door, from its admission to its end."""

    name: str
    #: tells this process from the engine's earlier and later ones
    serial: int
    one_post: bool
    admitting: bool = True
    #: while it drains for an operator's stop: the drain's deadline (deadline calls may come)
    drain_until: float | None = None
    #: calls sent to it and not returned
    calls: set[int] = field(default_factory=set)
    #: jobs its SubmitProof replies accepted that no AwaitProof has collected yet
    jobs: set[str] = field(default_factory=set)
    #: of those, the calls and jobs a drain stopped waiting for (the engine dropped them)
    abandoned_calls: set[int] = field(default_factory=set)
    abandoned_jobs: set[str] = field(default_factory=set)
    #: reads in a row not showing a call or job, and when the first of them was
    unseen: dict[int | str, tuple[int, float]] = field(default_factory=dict)
    #: PoSt calls in flight, and PoSt jobs accepted -> until when they keep its PoSt slot
    posts: set[int] = field(default_factory=set)
    post_jobs: dict[str, float] = field(default_factory=dict)
    #: suspects in flight (at most one)
    suspects: set[int] = field(default_factory=set)
    #: no partitioned job was sent to this process yet
    fresh: bool = True
    #: the first partitioned job while its partition 0 may wait in cuzk's GPU queue: its id
    #: (None: no such job), and its call while that is in flight
    guard: str | None = None
    guard_call: int | None = None

    def in_flight(self) -> int:
        return (len(self.calls) + len(self.jobs) - len(self.abandoned_calls)
                - len(self.abandoned_jobs))

    def load(self) -> int:
        return len(self.calls) + len(self.jobs)

    def post_busy(self, now: float) -> bool:
        return bool(self.posts) or any(until > now for until in self.post_jobs.values())


@dataclass
class _Job:
    """A job a SubmitProof named: where it is, and the SubmitProofs of it not yet returned."""

    #: the engine that has (or is being sent) it; None while its SubmitProof is held
    engine: str | None
    kind: str = ""
    submits: set[int] = field(default_factory=set)


@dataclass
class _Entry:
    """A call the book has: held, sent and not returned, or waiting for its leader."""

    call: Call
    #: arrival order, kept when the call is held a second time
    seq: int
    arrived: float
    #: its kind's deadline or its caller's, whichever is first (None: neither)
    deadline: float | None
    #: a deadline call's last moment to be sent and still proved in time (None: no deadline
    #: kind)
    latest: float | None
    #: release order: the door's place of its kind and claim, deadline, arrival
    order: tuple[int, float, int]
    retained: bool = False
    #: sent a second time already (or held for it): it is not sent a third
    retried: bool = False
    #: the engine it is in flight to (None: held, or joined to a leader)
    engine: str | None = None
    #: while held: since when, until when at the latest, and why
    held_since: float = 0.0
    until: float = 0.0
    cause: HoldCause = HoldCause.NO_ENGINE
    #: the process it must not be sent to again (its link to that one broke)
    not_on: int | None = None
    #: the process whose crash made it a suspect (None: not a suspect)
    suspect_of: int | None = None
    #: the call whose answer it waits for (a Join), or the calls waiting for its answer
    leader: int | None = None
    followers: list[int] = field(default_factory=list)

    @property
    def post(self) -> bool:
        return self.call.kind in POST_KINDS and self.call.method in RETRIABLE

    @property
    def partitioned(self) -> bool:
        return self.call.kind in PARTITIONED_KINDS and self.call.method in RETRIABLE


def _quoted(job: str) -> str:
    return repr(job if len(job) <= QUOTED_ID else job[:QUOTED_ID] + "...")


def _place_of(call: Call) -> int:
    """A call's place in the door's order: its kind's, lowered by a claimed priority."""
    kind = KIND_PLACES.get(call.kind, LAST_KIND_PLACE) if call.method in RETRIABLE \
        else LAST_KIND_PLACE
    claim = 0 if call.priority == Priority.PRIORITY_UNSPECIFIED \
        else CLAIMED_PLACES.get(call.priority, CLAIMED_PLACES[Priority.NORMAL])
    return max(kind, claim)


class DoorBook:
    """Every call of one door, from arrival to its end, and the engines behind it.

    Large on purpose: its many small methods are one decision table over one state (the calls
    and the engines), and every invariant below spans all of them, so splitting it would put
    one invariant in several places.

    Invariants (tests/supervisor/core/test_doorbook.py): held calls at most ``hold_max_calls``
    and ``hold_max_bytes``; none held past its ``until`` once :meth:`expired` has run then;
    retained bytes at most ``retry_max_bytes``; a call is sent twice at most; every call
    ends exactly once (a return, a refusal, a withdrawal, a cached answer, a broadcast or an
    echo); an engine's :meth:`in_flight` is 0 only when all its calls returned (or were
    abandoned) and all its jobs were collected (or abandoned); an engine with ``one_post`` has
    one PoSt in flight at most; an engine has one suspect in flight at most.

    The shell numbers calls, reads the few fields the book needs from a request (:class:`Call`)
    and reports back through :meth:`arrived`, :meth:`returned`, :meth:`admit`,
    :meth:`stop_admitting`, :meth:`reading`, :meth:`gone`, :meth:`expired` at
    :meth:`next_deadline`, and :meth:`closed`. A decision about a call replaces whatever was
    under way for it: on a :class:`Send` or :class:`Hold` of a call already sent the shell drops
    that attempt and never reports it, and a :class:`Refuse` ends the call at its caller. Each
    :class:`Send` is reported back once, by :meth:`returned`, unless a later decision replaced
    it; a held call's caller leaving is ``returned(..., CANCELLED)``. :class:`Abandoned` and
    :class:`Quarantined` only inform.
    """

    def __init__(self, *, hold_timeout: float, hold_max_calls: int, hold_max_bytes: int,
                 retry_max_bytes: int, engines: tuple[str, ...] = (),
                 rules: DoorRules | None = None) -> None:
        """``engines``: the door's engines, in its order; when there are several (a shared
        door), the :data:`TO_EVERY` calls are a :class:`Broadcast` to the admitting ones."""
        #: fixed for the book's life (a changed [door] is a new door)
        self.limits = DoorLimits(hold_timeout, hold_max_calls, hold_max_bytes, retry_max_bytes)
        self.rules = rules if rules is not None else DoorRules()
        self._shared = engines if len(engines) > 1 else ()
        self._seats: dict[str, _Seat] = {}
        self._entries: dict[int, _Entry] = {}
        self._held: dict[int, _Entry] = {}
        self._jobs: dict[str, _Job] = {}
        #: request id -> the call in flight (or held) that has it
        self._requests: dict[str, int] = {}
        self._quarantine: dict[str, Quarantine] = {}
        self._held_bytes = 0
        self._retained_bytes = 0
        self._arrivals = 0
        self._serials = 0

    # -- what the metrics and the control API read -----------------------------------------

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
        no AwaitProof has collected, less what a drain stopped waiting for: 0 when stopping it
        now loses nothing it could still answer."""
        seat = self._seats.get(engine)
        return 0 if seat is None else seat.in_flight()

    def admits(self, engine: str) -> bool:
        """Whether new calls may go to ``engine`` now."""
        seat = self._seats.get(engine)
        return seat is not None and seat.admitting

    def wants_reading(self, engine: str) -> bool:
        """Whether the book waits on a reading of ``engine``: its fresh process's first
        partitioned job keeps PoSts away until a reading shows its partition 0 left cuzk's
        GPU queue (a draining engine is read by its drain anyway)."""
        seat = self._seats.get(engine)
        return seat is not None and seat.admitting and seat.guard is not None

    def quarantined(self, now: float) -> list[Quarantine]:
        """The request ids quarantined now, the first to leave first."""
        self._end_quarantines(now)
        return sorted(self._quarantine.values(), key=lambda q: q.until)

    def release_quarantine(self, job: str) -> bool:
        """Take ``job`` out of quarantine (an operator's word); False if it was not in it."""
        return self._quarantine.pop(job, None) is not None

    def next_deadline(self) -> float | None:
        """When :meth:`expired` next has something to do (None: nothing held): a held call's
        ``until``, or the end of a PoSt job's hold on its engine's slot while a call waits."""
        dues = [e.until for e in self._held.values()]
        if self._held:
            dues += [until for seat in self._seats.values() for until in seat.post_jobs.values()]
        return min(dues, default=None)

    def answered_late(self, call: Call, arrived: float, now: float) -> bool:
        """Whether an engine's answer to ``call`` (come at ``arrived``), relayed ``now``, is
        past its deadline: its kind's, or its caller's if earlier. Only a kind's deadline makes
        an answer late (a caller's alone is the caller's business)."""
        kind_deadline = self._kind_deadline(call)
        limit = _time_limit(call, kind_deadline)
        return kind_deadline is not None and limit is not None and now - arrived > limit

    # -- engines ----------------------------------------------------------------------------

    def admit(self, engine: str, now: float) -> list[Decision]:
        """``engine``'s process answered and may take calls: the held calls it can take now,
        released in order (the engine with the fewest in flight takes each). A process that
        ended is reported :meth:`gone` before the engine's next one is admitted."""
        seat = self._seats.get(engine)
        if seat is None:
            self._serials += 1
            seat = self._seats[engine] = _Seat(engine, self._serials,
                                               engine in self.rules.one_post)
        seat.admitting, seat.drain_until = True, None
        return self._release(now)

    def stop_admitting(self, engine: str, now: float = 0.0,
                       drain_until: float | None = None) -> list[Decision]:
        """A stop of ``engine`` began: no new calls to it; AwaitProofs of its jobs still go.
        ``drain_until``: an operator's stop drains until then, and deadline calls no admitting
        engine can take may go to it while their allowance fits before that (None: a stop
        closed to them -- unhealthy, stalled, broken answers)."""
        seat = self._seats.get(engine)
        if seat is None:
            return []
        seat.admitting, seat.drain_until = False, drain_until
        return self._release(now) if drain_until is not None else []

    def reading(self, engine: str, now: float, reading: EngineReading) -> list[Decision]:
        """What a read of ``engine`` showed: a fresh process's PoSt slot is free once every
        job it lists has its partition 0 past cuzk's GPU queue (cuzk numbers the first job *it
        starts* 0, not the first the door sent: of several sent at once it may start any, and
        ``/status`` lists only started jobs, in no order); while it drains, the calls and jobs
        it shows it no longer has are abandoned (see :class:`~cuzkd.states.DoorAbandon`)."""
        seat = self._seats.get(engine)
        if seat is None:
            return []
        decisions: list[Decision] = []
        if seat.guard is not None and reading.jobs and reading.jobs <= reading.past_gpu_queue:
            seat.guard = seat.guard_call = None
            decisions += self._release(now)
        if not seat.admitting:
            decisions += self._abandon(seat, now, reading)
        return decisions

    def gone(self, engine: str, now: float, end: EngineEnd) -> list[Decision]:
        """``engine``'s process ended as ``end`` says. Its retained Prove/SubmitProof calls are
        sent again or held (after a crash, as suspects; a suspect that was alone among
        suspects on it is quarantined instead); its other calls are refused, and the jobs it
        had are forgotten (an AwaitProof of one is then ``unknown_job``)."""
        seat = self._seats.pop(engine, None)
        if seat is None:
            return []
        why = DoorRetry.CRASH if end in (EngineEnd.CRASHED, EngineEnd.OOM_KILLED) \
            else DoorRetry.STOP
        decisions: list[Decision] = []
        entries = sorted((self._entries[c] for c in seat.calls), key=lambda e: e.seq)
        poison = self._entries[next(iter(seat.suspects))] if (
            end is EngineEnd.CRASHED and len(seat.suspects) == 1) else None
        if poison is not None and poison.call.job:
            entries.remove(poison)
            poison.engine = None
            decisions += self._quarantine_call(poison, now, engine)
        if end is EngineEnd.CRASHED and poison is None:  # a crash no quarantine explains
            for entry in [*entries, *self._broke_on(seat.serial)]:
                entry.suspect_of = entry.suspect_of if entry.suspect_of is not None \
                    else seat.serial
        for entry in entries:
            entry.engine = None
            decisions += self._lost(entry, now, why, engine)
        for job in seat.jobs:  # lost with the process, unless sent again above
            decisions += self._settle_job(job, now)
        return decisions + self._release(now)

    # -- calls ------------------------------------------------------------------------------

    def arrived(self, call: Call, now: float) -> list[Decision]:
        """A call came in: the decision about it first, then the refusals of held calls it
        displaced (a full door keeps the calls it would release first)."""
        if call.id in self._entries:
            raise ValueError(f"call {call.id} arrived while a call of that number lasts")
        self._arrivals += 1
        entry = self._entries[call.id] = self._entry(call, now)
        if call.method in RETRIABLE and call.job:
            if (known := self._quarantine_of(call.job, now)) is not None:
                return self._refuse(entry, now, DoorRefusal.QUARANTINED, _quarantine_text(
                    known, now))
            if (leader := self._requests.get(call.job)) is not None:
                return self._join(entry, self._entries[leader], now)
            self._requests[call.job] = call.id
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
        if entry.leader is not None:  # a joined call: only its caller leaving is its own end
            if outcome is Outcome.CANCELLED:
                self._entries[entry.leader].followers.remove(call_id)
                del self._entries[call_id]
            return []
        named = entry.call.job
        if entry.engine is None:
            if outcome is not Outcome.CANCELLED:
                return []  # an attempt the book had already replaced: not this call's end
            held_for = now - entry.held_since
            decisions = self._lead_on(entry, now)
            self._forget(entry)
            return [Withdrawn(call_id, held_for), *decisions, *self._settle_job(named, now)]
        seat = self._seats[entry.engine]
        if outcome is Outcome.BROKEN:
            self._off_seat(seat, entry)
            entry.engine, entry.not_on = None, seat.serial
            return self._lost(entry, now, DoorRetry.BROKEN, seat.name) + self._release(now)
        method = entry.call.method
        if method == "SubmitProof" and outcome is Outcome.OK and (job or named):
            self._accepted(seat, job or named, entry.call.kind, now)
        elif method == "AwaitProof" and outcome is not Outcome.CANCELLED:
            self._collected(seat, named)
        if seat.guard_call == call_id:
            self._guard_call_ended(seat, entry, outcome)
        elif (seat.guard is not None and entry.partitioned and method == "Prove"
              and outcome is Outcome.OK):
            seat.guard = seat.guard_call = None  # a job proved whole: past its job 0's partition 0
        if outcome is Outcome.CANCELLED:
            decisions = self._lead_on(entry, now)
        else:
            decisions = [Echo(f, call_id) for f in entry.followers]
            for follower in entry.followers:
                del self._entries[follower]
            entry.followers = []
        self._forget(entry)
        return decisions + self._settle_job(named, now) + self._release(now)

    def expired(self, now: float) -> list[Decision]:
        """The refusals of held calls whose time has come: a deadline call that can no longer
        be proved in time, a call held ``hold_timeout`` for an engine. A call waiting only its
        turn on an engine that takes calls (a PoSt slot, a suspect's) is not refused for the
        hold_timeout: what it waits for is in flight and ends. Calls a freed PoSt slot lets go
        are released."""
        decisions: list[Decision] = []
        for entry in sorted(self._held.values(), key=lambda e: e.order):
            if entry.call.id not in self._held or entry.until > now:
                continue
            if entry.latest is not None and entry.latest <= now:
                decisions += self._refuse_late(entry, now)
            elif self._takers(entry, now, turns=False):
                entry.until = self._until(entry, now)
                decisions.append(Hold(entry.call.id, entry.until, cause=entry.cause))
            else:
                decisions += self._refuse(entry, now, DoorRefusal.HOLD_TIMEOUT, (
                    f"no engine behind cuzkd's door could take the call within its"
                    f" hold_timeout ({self.limits.hold_timeout:g} s)"))
        for seat in self._seats.values():
            seat.post_jobs = {job: until for job, until in seat.post_jobs.items() if until > now}
        return decisions + self._release(now)

    def closed(self, now: float) -> list[Decision]:
        """cuzkd's door closes (its process exits): every call held, joined or still on an
        engine is refused, naming the restart."""
        decisions: list[Decision] = []
        for entry in sorted(self._entries.values(), key=lambda e: e.order):
            if entry.call.id in self._entries and entry.leader is None:
                where = ("held" if entry.engine is None
                         else f"in flight on engine {entry.engine}")
                decisions += self._refuse(entry, now, DoorRefusal.SHUTTING_DOWN, (
                    f"cuzkd stopped (a restart or a stop) while the call was {where}; the "
                    f"next cuzkd's door takes new calls"))
        return decisions

    # -- the decisions ----------------------------------------------------------------------

    def _entry(self, call: Call, now: float) -> _Entry:
        """A new call's entry: its deadline and last moment to be sent, its place."""
        kind_deadline = self._kind_deadline(call)
        limit = _time_limit(call, kind_deadline)
        deadline = None if limit is None else now + limit
        latest = None
        if kind_deadline is not None and deadline is not None:
            latest = deadline - self.rules.allowances.get(call.kind, 0.0)
        order = (_place_of(call), math.inf if deadline is None else deadline, self._arrivals)
        return _Entry(call, self._arrivals, now, deadline, latest, order)

    def _kind_deadline(self, call: Call) -> float | None:
        """The seconds ``call``'s kind gives it (``proof_deadlines``): a ``Prove`` or
        ``SubmitProof`` of a kind with a deadline; None otherwise."""
        return self.rules.deadlines.get(call.kind) if call.method in RETRIABLE else None

    def _place(self, entry: _Entry, now: float, retry: DoorRetry | None) -> list[Decision]:
        """Send a call that is not held, hold it, or refuse it."""
        call = entry.call
        if entry.latest is not None and entry.latest <= now:
            return self._refuse_late(entry, now)
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
        engine = self._choose(entry, now)
        if engine is not None:
            return [self._send(entry, engine, now, retry)]
        if call.method in FROM_CACHE:
            del self._entries[call.id]
            return [FromCache(call.id)]
        return self._hold(entry, now, retry)

    def _broke_on(self, serial: int) -> list[_Entry]:
        """The held calls whose link broke on process ``serial`` as it was dying: its crash is
        theirs too (the reaper may see an exit after the call has seen its link go)."""
        return [e for e in self._held.values() if e.not_on == serial]

    def _takers(self, entry: _Entry, now: float, *, turns: bool = True) -> list[_Seat]:
        """The engines that may take the call now: admitting ones, else (a deadline call)
        ones draining for an operator's stop with room for its proving allowance before the
        drain's deadline; never the process it broke on. ``turns``: also keep an engine's
        turns -- one suspect at a time, one PoSt at a time where it must."""
        seats = [s for s in self._seats.values() if s.serial != entry.not_on]
        taking = [s for s in seats if s.admitting]
        if not taking and entry.latest is not None:
            allowance = self.rules.allowances.get(entry.call.kind, 0.0)
            taking = [s for s in seats if s.drain_until is not None
                      and now + allowance <= s.drain_until]
        if turns:
            taking = [s for s in taking if self._turn(s, entry, now)]
        return taking

    def _turn(self, seat: _Seat, entry: _Entry, now: float) -> bool:
        """Whether it is the call's turn on ``seat``: no other suspect there for a suspect;
        with ``one_post``, no PoSt there (nor a fresh process's first partitioned job) for a
        PoSt, and no PoSt there for a fresh process's first partitioned job."""
        if entry.suspect_of is not None and seat.suspects:
            return False
        if not seat.one_post:
            return True
        if entry.post:
            return not seat.post_busy(now) and seat.guard is None
        return not (entry.partitioned and seat.fresh and seat.post_busy(now))

    def _choose(self, entry: _Entry, now: float) -> str | None:
        """The engine that takes the call: of those that may, the one with the fewest in
        flight (by name on a tie)."""
        best = min(self._takers(entry, now), key=lambda s: (s.load(), s.name), default=None)
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
        call, seat = entry.call, self._seats[engine]
        serialized = entry.call.id in self._held and entry.cause is HoldCause.POST_IN_FLIGHT
        held_for = self._unhold(entry, now)
        entry.engine = engine
        seat.calls.add(call.id)
        if entry.post:
            seat.posts.add(call.id)
        if entry.suspect_of is not None:
            seat.suspects.add(call.id)
        if entry.partitioned and seat.one_post and seat.fresh:
            seat.fresh = False
            seat.guard, seat.guard_call = call.job or f"#{call.id}", call.id
        if call.method == "SubmitProof" and call.job:
            job = self._jobs.setdefault(call.job, _Job(engine, call.kind))
            job.engine = engine
            job.submits.add(call.id)
        entry.retained = (call.method in RETRIABLE and not entry.retried
                          and self._retained_bytes + call.size <= self.limits.retry_max_bytes)
        self._retained_bytes += call.size if entry.retained else 0
        return Send(call.id, engine, entry.retained, held_for, retry, serialized)

    def _until(self, entry: _Entry, now: float) -> float:
        """A held call's time: one hold_timeout, or less for a deadline call."""
        until = now + self.limits.hold_timeout
        return until if entry.latest is None else min(until, entry.latest)

    def _hold(self, entry: _Entry, now: float, retry: DoorRetry | None) -> list[Decision]:
        """Hold a call, displacing the held ones released last (after it; first of all those
        past their deadline) if the door is full; refuse it when even that leaves no room."""
        size = entry.call.size
        calls_over = len(self._held) + 1 - self.limits.hold_max_calls
        bytes_over = self._held_bytes + size - self.limits.hold_max_bytes
        later = [] if calls_over <= 0 and bytes_over <= 0 else sorted(
            (e for e in self._held.values() if e.order > entry.order or _past(e, now)),
            key=lambda e: (_past(e, now), e.order), reverse=True)
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
        entry.held_since, entry.until = now, self._until(entry, now)
        entry.cause = self._cause(entry, now)
        self._held[entry.call.id] = entry
        self._held_bytes += size
        if entry.call.method == "SubmitProof" and entry.call.job:  # its awaits wait for it
            self._jobs.setdefault(entry.call.job, _Job(None, entry.call.kind)).submits.add(
                entry.call.id)
        return [Hold(entry.call.id, entry.until, retry, entry.cause), *decisions]

    def _cause(self, entry: _Entry, now: float) -> HoldCause:
        """Why a call is held: no engine may take it, or only its turn keeps it."""
        if entry.call.method in FOLLOW_JOB or not self._takers(entry, now, turns=False):
            return HoldCause.NO_ENGINE
        return HoldCause.SUSPECT if entry.suspect_of is not None else HoldCause.POST_IN_FLIGHT

    def _release(self, now: float) -> list[Decision]:
        """Send the held calls an engine can take now, in the door's order."""
        decisions: list[Decision] = []
        for entry in sorted(self._held.values(), key=lambda e: e.order):
            if entry.call.id not in self._held:
                continue
            if entry.latest is not None and entry.latest <= now:
                decisions += self._refuse_late(entry, now)
                continue
            if everyone := self._everyone(entry.call):
                decisions.append(self._broadcast(entry, everyone, now))
                continue
            job = self._jobs.get(entry.call.job) if entry.call.method in FOLLOW_JOB else None
            engine = job.engine if job is not None else self._choose(entry, now)
            if engine is not None:
                decisions.append(self._send(entry, engine, now, None))
            else:
                entry.cause = self._cause(entry, now)
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
                    self._collected(seat, call.job)
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

    def _refuse_late(self, entry: _Entry, now: float) -> list[Decision]:
        """Refuse a deadline call that can no longer be proved in time."""
        assert entry.deadline is not None
        kind = entry.call.kind
        allowance = self.rules.allowances.get(kind, 0.0)
        return self._refuse(entry, now, DoorRefusal.DEADLINE, (
            f"a {kind} call that can no longer be proved by its deadline: it came"
            f" {now - entry.arrived:.1f} s ago, its deadline is"
            f" {entry.deadline - entry.arrived:.1f} s after that, proving may take {allowance:g} s"
            f" ([door] proving_allowance), and no engine behind cuzkd's door could take it in"
            f" time"))

    def _refuse(self, entry: _Entry, now: float, reason: DoorRefusal, message: str,
                code: Code | None = None) -> list[Decision]:
        """Refuse a call and the calls joined to it, then the calls held for its job if that
        leaves the job nowhere."""
        code = REFUSAL_CODES[reason] if code is None else code
        held_for = self._unhold(entry, now)
        decisions: list[Decision] = [Refuse(entry.call.id, reason, code, message, held_for)]
        for follower in entry.followers:
            del self._entries[follower]
            decisions.append(Refuse(follower, reason, code, message))
        entry.followers = []
        self._forget(entry)
        return decisions + self._settle_job(entry.call.job, now)

    def _join(self, entry: _Entry, leader: _Entry, now: float) -> list[Decision]:
        """A call whose ``request_id`` ``leader`` has: the same call waits for its answer,
        another is refused."""
        call, first = entry.call, leader.call
        if call.method == first.method and call.request == first.request:
            entry.leader = first.id
            leader.followers.append(call.id)
            return [Join(call.id, first.id)]
        return self._refuse(entry, now, DoorRefusal.ALREADY_EXISTS, (
            f"request_id {_quoted(call.job)} is in flight behind cuzkd's door already, in a"
            f" {first.method} with other request bytes: one request id is one proof"))

    def _lead_on(self, entry: _Entry, now: float) -> list[Decision]:
        """A leader's caller left: its first follower leads the rest and is placed."""
        if not entry.followers:
            return []
        first, *rest = entry.followers
        entry.followers = []
        heir = self._entries[first]
        heir.leader, heir.followers = None, rest
        for follower in rest:
            self._entries[follower].leader = first
        self._requests[heir.call.job] = first
        return self._place(heir, now, None)

    def _unhold(self, entry: _Entry, now: float) -> float | None:
        """Take a call out of the held ones; seconds it was held (None: it was not)."""
        if self._held.pop(entry.call.id, None) is None:
            return None
        self._held_bytes -= entry.call.size
        return now - entry.held_since

    def _off_seat(self, seat: _Seat, entry: _Entry) -> None:
        """The call is no longer on ``seat``."""
        call_id = entry.call.id
        for ids in (seat.calls, seat.posts, seat.suspects, seat.abandoned_calls):
            ids.discard(call_id)
        seat.unseen.pop(call_id, None)

    def _forget(self, entry: _Entry) -> None:
        """A call ended: nothing of it stays in the book."""
        call = entry.call
        del self._entries[call.id]
        self._unhold(entry, 0.0)
        if entry.engine is not None:
            self._off_seat(self._seats[entry.engine], entry)
        if entry.retained:
            self._retained_bytes -= call.size
        if self._requests.get(call.job) == call.id:
            del self._requests[call.job]
        job = self._jobs.get(call.job) if call.method == "SubmitProof" else None
        if job is not None:
            job.submits.discard(call.id)

    def _accepted(self, seat: _Seat, job_id: str, kind: str, now: float) -> None:
        """A SubmitProof's reply: ``seat`` has the job until an AwaitProof collects it (a PoSt
        job keeps its PoSt slot meanwhile, for its deadline at most)."""
        self._jobs.setdefault(job_id, _Job(seat.name, kind))  # its request named none
        seat.jobs.add(job_id)
        if kind in POST_KINDS:
            seat.post_jobs[job_id] = now + self.rules.deadlines.get(kind,
                                                                    self.limits.hold_timeout)

    def _collected(self, seat: _Seat, job_id: str) -> None:
        """``seat`` no longer has the job (an AwaitProof collected it, it is sent again)."""
        seat.jobs.discard(job_id)
        seat.post_jobs.pop(job_id, None)
        seat.abandoned_jobs.discard(job_id)
        seat.unseen.pop(job_id, None)
        if seat.guard == job_id:
            seat.guard = seat.guard_call = None

    def _guard_call_ended(self, seat: _Seat, entry: _Entry, outcome: Outcome) -> None:
        """The call of a fresh process's first partitioned job ended: an error means cuzk may
        never have dispatched it (the process is fresh again); a Prove's end means its
        partition 0 left the queue, as does any end of a job cuzk named itself; a SubmitProof's
        job keeps the guard until a reading shows its partition 0 past the queue."""
        seat.guard_call = None
        if outcome is Outcome.ERROR:
            seat.fresh, seat.guard = True, None
        elif entry.call.method == "Prove" or not entry.call.job:
            seat.guard = None

    def _abandon(self, seat: _Seat, now: float, reading: EngineReading) -> list[Decision]:
        """Of a draining engine's calls and jobs, those its reading shows it no longer has."""
        decisions: list[Decision] = []
        for call_id in sorted(seat.calls - seat.abandoned_calls):
            entry = self._entries[call_id]
            why = self._dropped(seat, call_id, entry.call.job, entry.call.kind, entry, now,
                                reading)
            if why is not None:
                seat.abandoned_calls.add(call_id)
                decisions.append(Abandoned(call_id, seat.name, why, entry.call.job))
        for job_id in sorted(seat.jobs - seat.abandoned_jobs):
            job = self._jobs.get(job_id)
            if self._dropped(seat, job_id, job_id, job.kind if job else "", None, now,
                             reading) is not None:
                seat.abandoned_jobs.add(job_id)
                decisions.append(Abandoned(None, seat.name, DoorAbandon.JOB_NOT_LISTED, job_id))
                decisions += self._abandon_awaits(seat, job_id)
        return decisions

    def _abandon_awaits(self, seat: _Seat, job_id: str) -> list[Decision]:
        """The AwaitProofs of an abandoned job will never be answered either."""
        decisions: list[Decision] = []
        for call_id in sorted(seat.calls - seat.abandoned_calls):
            call = self._entries[call_id].call
            if call.method in FOLLOW_JOB and call.job == job_id:
                seat.abandoned_calls.add(call_id)
                decisions.append(Abandoned(call_id, seat.name, DoorAbandon.JOB_NOT_LISTED,
                                           job_id))
        return decisions

    def _dropped(self, seat: _Seat, key: int | str, job: str, kind: str,
                 entry: _Entry | None, now: float, reading: EngineReading) -> DoorAbandon | None:
        """Why the engine no longer has this call (``entry``, its ``key`` its id) or job
        (``entry`` None, ``key`` its id), if the reading shows it does not; None while it
        may."""
        if entry is not None and entry.post and entry.deadline is not None \
                and now > entry.deadline:
            return DoorAbandon.PAST_DEADLINE
        if entry is not None and not (entry.post or entry.partitioned):
            return None  # a status read, an AwaitProof (its job decides), ...
        if _shown(job, kind, reading):
            seat.unseen.pop(key, None)
            return None
        reads, since = seat.unseen.get(key, (0, now))
        seat.unseen[key] = reads + 1, since
        if reads + 1 < UNSEEN_READS or (entry is None and now - since < JOB_GRACE):
            return None
        if entry is None:
            return DoorAbandon.JOB_NOT_LISTED
        return DoorAbandon.POST_QUEUE_EMPTY if entry.post else DoorAbandon.NOT_LISTED

    def _quarantine_of(self, job: str, now: float) -> Quarantine | None:
        self._end_quarantines(now)
        return self._quarantine.get(job)

    def _end_quarantines(self, now: float) -> None:
        for job in [j for j, q in self._quarantine.items() if q.until <= now]:
            del self._quarantine[job]

    def _quarantine_call(self, entry: _Entry, now: float, engine: str) -> list[Decision]:
        """The suspect alone on ``engine`` when it crashed again: its id is quarantined, the
        call refused, and the crash that made it a suspect is explained (the calls suspected
        with it are suspects no more)."""
        job = entry.call.job
        self._quarantine[job] = known = Quarantine(job, engine, now,
                                                   now + self.rules.quarantine)
        while len(self._quarantine) > MAX_QUARANTINED:
            del self._quarantine[min(self._quarantine.values(), key=lambda q: q.until).job]
        for other in self._entries.values():
            if other is not entry and other.suspect_of == entry.suspect_of:
                other.suspect_of = None
        return [Quarantined(entry.call.id, job, engine, known.until),
                *self._refuse(entry, now, DoorRefusal.QUARANTINED, _quarantine_text(known, now))]

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


def _time_limit(call: Call, kind_deadline: float | None) -> float | None:
    """The seconds after its arrival a call is due: its kind's deadline or its caller's own,
    whichever is earlier (None: it has neither)."""
    limits = [s for s in (kind_deadline, call.timeout) if s is not None]
    return min(limits) if limits else None


def _past(entry: _Entry, now: float) -> bool:
    return entry.deadline is not None and entry.deadline <= now


def _shown(job: str, kind: str, reading: EngineReading) -> bool:
    """Whether a reading shows the engine may still have the job: listed in ``/status`` or,
    for a partitioned kind, one of its kind pending in ``GetStatus``; for a PoSt kind, one of
    its kind pending or in progress. What was not read shows everything."""
    queues = reading.queues
    if queues is None or not queues.known:
        return True
    queue = queues.queues.get(kind)
    if kind in POST_KINDS:
        return queue is not None and queue.jobs > 0
    if reading.jobs is None or job in reading.jobs:
        return True
    return queue is not None and queue.pending > 0


def _quarantine_text(known: Quarantine, now: float) -> str:
    return (f"request_id {_quoted(known.job)} is quarantined for {known.until - now:.0f} s more:"
            f" engine {known.engine} crashed twice with it in flight, the second time with no"
            f" other suspect beside it; `cuzkd door release ID` ends the quarantine")
