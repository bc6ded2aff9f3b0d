"""One front door: a gRPC server at the address Curio dials, relaying every
``cuzk.v1.ProvingEngine`` call to an engine behind it as raw bytes.

The door is a shell around its book (:class:`~cuzkd.supervisor.core.doorbook.DoorBook`), the
pure owner of every decision: which engine takes a call, which calls wait (and for how long,
how many, how many bytes), which are retried once after their engine died, which are refused.
The door feeds it what happens -- a call arriving, answered or abandoned by its caller, an
engine admitted, stopping, gone, the clock passing a deadline -- and carries out what it
returns: a call sent to an engine (through the engine's :class:`~.seat.EngineSeat`), held, or
refused with ``UNAVAILABLE`` and the book's reason. Each call waits on its own mailbox of
decisions, so a call whose engine died is simply placed again by the next decision.

``GetStatus`` and ``GetMetrics`` never wait: an engine that takes calls answers them, else the
last good reply is given again, else a clear ``UNAVAILABLE``. A door several engines share
asks each admitting one for them and for ``PreloadSRS`` (the book's Broadcast) and answers
with the replies merged (:mod:`.merge`), an engine that cannot answer now standing in with
its last good reply (which replies stand in, and which engines are not waited on, is
:class:`~cuzkd.supervisor.core.replycache.ReplyCache`'s). Requests that do not decode as
their method's message get ``INVALID_ARGUMENT``, an unknown method ``UNIMPLEMENTED``, a message
over the size limit grpc's ``RESOURCE_EXHAUSTED``: the engines never see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import structlog

from cuzkd.config.doors import DoorPlan
from cuzkd.errors import BadRequest, GrpcError, RequestIdTooLong
from cuzkd.errortext import error_text
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.metrics.door_metrics import DoorMetrics
from cuzkd.states import HoldEnd
from cuzkd.supervisor.core.doorbook import (
    FROM_CACHE,
    QUOTED_ID,
    Abandoned,
    Broadcast,
    Call,
    Decision,
    DoorBook,
    DoorRules,
    Echo,
    EngineEnd,
    EngineReading,
    FromCache,
    Hold,
    Outcome,
    Quarantine,
    Quarantined,
    Refuse,
    Send,
    Withdrawn,
)
from cuzkd.supervisor.core.replycache import READING_TIMEOUT, ReplyCache, read_timeout
from cuzkd.supervisor.door.merge import merge_metrics, merge_preload, merge_status
from cuzkd.supervisor.door.requests import (
    REQUESTS,
    SERVICE,
    broken_reply,
    method_name,
    read_call,
    submitted_job,
)
from cuzkd.supervisor.door.seat import EngineSeat, SendResult, Unanswered
from cuzkd.supervisor.door.server import CallContext
from cuzkd.supervisor.tasks import TaskSet

log = structlog.get_logger("cuzkd.door")

#: Where a call goes: an engine's process, by its generation when the book decided.
Target = tuple[str, int]
#: How an engine answered a call: its reply's bytes, or its gRPC error.
Answer = bytes | grpc.aio.AioRpcError


@dataclass(frozen=True)
class Echoed:
    """The answer of the call this one joined (the same request, sent once)."""

    answer: Answer


#: What a waiting call is told next: send it (to one process, or to each of a list and merge
#: their replies), refuse it, answer it from the last good reply, or with the answer of the
#: call it joined.
Placement = Target | list[Target] | Refuse | FromCache | Echoed


@dataclass
class _Caller:
    """A call whose caller waits: what the book knows of it, and its mailbox."""

    call: Call
    #: when it came (the door's clock)
    arrived: float
    mailbox: asyncio.Queue[Placement] = field(default_factory=asyncio.Queue)


class Door:
    """One :class:`~cuzkd.config.doors.DoorPlan`'s book and seats (its server is
    :class:`~.doors.Doors`'). Its methods carry out the book's decisions, one per kind of
    decision or call, over the book and the seats."""

    def __init__(self, plan: DoorPlan, clock: Callable[[], float],
                 metrics: DoorMetrics, on_change: Callable[[], None] = lambda: None) -> None:
        """``on_change``: told after each decision (what an engine has in flight may have
        changed)."""
        self.plan = plan
        self._clock = clock
        self._metrics = metrics
        self._on_change = on_change
        self._book = DoorBook(hold_timeout=plan.hold_timeout,
                              hold_max_calls=plan.hold_max_calls,
                              hold_max_bytes=plan.hold_max_bytes,
                              retry_max_bytes=plan.retry_max_bytes,
                              engines=plan.engines,
                              rules=DoorRules(plan.deadlines, plan.allowances, plan.quarantine,
                                              plan.one_post))
        self.seats = {name: EngineSeat(name, plan.max_message_bytes, self)
                      for name in plan.engines}
        self._ids = itertools.count(1)
        #: call id -> the call and its mailbox while its caller waits (see :data:`Placement`)
        self._callers: dict[int, _Caller] = {}
        #: call id -> its engine's answer, while the calls that joined it are told
        self._answers: dict[int, Answer] = {}
        #: set while no caller waits (the door's close waits for its refusals to leave)
        self._quiet = asyncio.Event()
        self._quiet.set()
        #: the door is closing: cuzkd exits, no engine will take a call
        self._closed = False
        #: each engine's last good reply, and the engines not waited on (their reads go on
        #: behind, one at a time: a seat shares a read in flight)
        self._replies = ReplyCache(plan.engines)
        self._behind = TaskSet()
        self._timer: asyncio.TimerHandle | None = None
        self._log = log.bind(door=plan.name)
        #: refusals log once per 10 s per reason (a full door refuses every call)
        self._limited = LimitedLog()

    # -- the seats' owner: what the runners say ------------------------------------------

    # These run inside the runner's own handling (its exit, its state changes): whatever goes
    # wrong in the door is logged here and never breaks the engine's supervision.

    def admit(self, engine: str) -> None:
        self._log.info("door_engine_admitted", engine=engine, held=self._book.held_calls)
        with self._guarded("admitting", engine):
            self._carry_out(self._book.admit(engine, self._clock()))

    def stop_admitting(self, engine: str, drain_left: float | None) -> None:
        now = self._clock()
        drain_until = None if drain_left is None else now + drain_left
        with self._guarded("stop_admitting", engine):
            self._carry_out(self._book.stop_admitting(engine, now, drain_until))

    def in_flight(self, engine: str) -> int:
        return self._book.in_flight(engine)

    def wants_reading(self, engine: str) -> bool:
        """Whether the book waits on a reading of ``engine`` (its fresh process's first
        partitioned job keeps PoSts away until one shows partition 0 past cuzk's GPU queue)."""
        return self._book.wants_reading(engine)

    def reading(self, engine: str, reading: EngineReading) -> None:
        with self._guarded("reading", engine):
            self._carry_out(self._book.reading(engine, self._clock(), reading))

    def gone(self, engine: str, end: EngineEnd) -> None:
        with self._guarded("gone", engine):
            self._carry_out(self._book.gone(engine, self._clock(), end))

    @contextlib.contextmanager
    def _guarded(self, event: str, engine: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # a bug: the door's, not the engine's
            self._log.error("door_book_failed", engine=engine, on=event,
                            error=error_text(exc), exc_info=exc)

    @property
    def held_calls(self) -> int:
        return self._book.held_calls

    def quarantined(self) -> list[Quarantine]:
        """The request ids this door refuses now (poison requests)."""
        return self._book.quarantined(self._clock())

    def release(self, job: str) -> bool:
        """End ``job``'s quarantine (an operator's word); False if it was not quarantined."""
        released = self._book.release_quarantine(job)
        if released:
            self._log.info("door_request_released", request_id=job[:QUOTED_ID])
        self._metrics.quarantined(self.plan.name, len(self._book.quarantined(self._clock())))
        return released

    # -- the book's decisions --------------------------------------------------------------

    def _carry_out(self, decisions: list[Decision]) -> None:
        """Hand each decision to its call's mailbox. A Hold needs nothing (the call waits on
        its mailbox; an attempt under way for it was lost already), nor a Join (it waits for
        its leader's Echo), nor a Withdrawn (its caller left)."""
        for decision in decisions:
            caller = self._callers.get(decision.call) if decision.call is not None else None
            self._count(decision, caller)
            mailbox = caller.mailbox if caller is not None else None
            match decision:
                case Send(engine=engine) if mailbox is not None:
                    mailbox.put_nowait((engine, self.seats[engine].generation))
                    if decision.retry is not None:
                        self._log.info("door_call_retried", call=decision.call,
                                       engine=engine, reason=str(decision.retry))
                case Refuse(reason=reason) if mailbox is not None:
                    mailbox.put_nowait(decision)
                    self._limited.log(self._log, "warning", "door_call_refused", key=reason,
                                      reason=str(reason), code=str(decision.code),
                                      error=decision.message, held_for=decision.held_for)
                case FromCache() if mailbox is not None:
                    mailbox.put_nowait(decision)
                case Broadcast(engines=engines) if mailbox is not None:
                    mailbox.put_nowait([(e, self.seats[e].generation) for e in engines])
                case Echo(leader=leader) if mailbox is not None:
                    mailbox.put_nowait(Echoed(self._answers[leader]))
                case Hold(retry=retry) if retry is not None:
                    self._log.info("door_retry_deferred", call=decision.call,
                                   reason=str(retry))
                case Abandoned(engine=engine, reason=reason, job=job):
                    self._log.info("door_drain_abandoned", engine=engine, call=decision.call,
                                   reason=str(reason), request_id=job[:QUOTED_ID])
                case Quarantined(job=job, engine=engine, until=until):
                    self._log.warning("door_request_quarantined", engine=engine,
                                      call=decision.call, request_id=job[:QUOTED_ID],
                                      seconds=round(until - self._clock()))
        now = self._clock()
        self._metrics.held(self.plan.name, self._book.held_calls)
        self._metrics.quarantined(self.plan.name, len(self._book.quarantined(now)))
        self._arm_timer()
        self._on_change()

    def _count(self, decision: Decision, caller: _Caller | None) -> None:
        """The door's own figures of a decision: hold times by kind, PoSts serialized,
        retries, refusals, drains' abandoned work. A retry is counted where it is decided:
        sent at once, or held for the engine's next process."""
        door, metrics = self.plan.name, self._metrics
        kind = caller.call.kind if caller is not None else ""
        match decision:
            case Send(held_for=held_for) | Broadcast(held_for=held_for) if held_for is not None:
                metrics.hold_ended(door, held_for, HoldEnd.PLACED, kind)
            case Refuse(held_for=held_for) if held_for is not None:
                metrics.hold_ended(door, held_for, HoldEnd.REFUSED, kind)
            case Withdrawn(held_for=held_for):
                metrics.hold_ended(door, held_for, HoldEnd.CANCELLED, kind)
        match decision:
            case Send(retry=retry) | Hold(retry=retry) if retry is not None:
                metrics.retried(door, retry)
            case Refuse(reason=reason):
                metrics.refused(door, reason, kind)
            case Abandoned(reason=reason):
                metrics.abandoned(door, reason)
        if isinstance(decision, Send) and decision.serialized:
            metrics.post_serialized(door, kind, decision.held_for or 0.0)

    def _arm_timer(self) -> None:
        """Wake up at the book's next deadline (a held call's hold_timeout)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due = self._book.next_deadline()
        if due is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(loop.time() + max(0.0, due - self._clock()),
                                       self._expire)

    def _expire(self) -> None:
        self._timer = None
        self._carry_out(self._book.expired(self._clock()))

    def _returned(self, call: Call, outcome: Outcome, job: str = "",
                  answer: Answer | None = None) -> None:
        """Tell the book how the call ended; ``answer``: the engine's, for the calls that
        joined it."""
        if answer is not None:
            self._answers[call.id] = answer
        try:
            self._carry_out(self._book.returned(call.id, self._clock(), outcome, job))
        finally:
            self._answers.pop(call.id, None)

    # -- the calls -------------------------------------------------------------------------

    async def relay(self, path: str, request: bytes,
                    context: CallContext) -> bytes:
        """One call from Curio: its reply's bytes, or an abort with a gRPC status."""
        method = method_name(path)
        if method is None:
            raise GrpcError(grpc.StatusCode.UNIMPLEMENTED,
                         f"unknown method {path[:200]}: cuzkd's door serves {SERVICE} "
                         f"({', '.join(REQUESTS)})")
        try:
            call = read_call(next(self._ids), method, request, context.time_remaining())
        except BadRequest as exc:
            if isinstance(exc, RequestIdTooLong):
                self._metrics.bound_hit(self.plan.name, "request_id")
            raise GrpcError(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {exc}") from None
        caller = self._callers[call.id] = _Caller(call, self._clock())
        self._quiet.clear()
        ended = False
        try:
            arrived = self._book.arrived(call, self._clock())
            self._carry_out(self._book.closed(self._clock()) if self._closed else arrived)
            while True:
                placement = await caller.mailbox.get()
                if isinstance(placement, Refuse):
                    ended = True
                    self._proved(call, request, None, placement.code)
                    raise GrpcError(grpc.StatusCode[placement.code],
                                 f"{method}: {placement.message}")
                if isinstance(placement, FromCache):
                    ended = True
                    return await self._from_cache(method, context)
                if isinstance(placement, Echoed):
                    ended = True
                    return await self._echo(caller, request, placement.answer, context)
                if isinstance(placement, list):
                    ended = True
                    return await self._to_every(call, path, request, placement, context)
                result = await self._send(call, path, request, placement, context)
                if isinstance(result, bytes) and (why := broken_reply(method, result)):
                    self._broken_answer(call, placement, why)
                    result = Unanswered.BROKEN
                if result is Unanswered.BROKEN:  # the book places it again, never on that process
                    self._returned(call, Outcome.BROKEN)
                if isinstance(result, Unanswered):
                    continue  # its engine died under it: the book's next decision places it
                ended = True
                return await self._answer(caller, request, placement[0], result, context)
        finally:
            del self._callers[call.id]
            if not ended:  # its caller went away (cancelled, deadline): the book forgets it
                self._returned(call, Outcome.CANCELLED)
                self._proved(call, request, None, grpc.StatusCode.CANCELLED.name)
            if not self._callers:
                self._quiet.set()

    def _broken_answer(self, call: Call, placement: Placement, why: str) -> None:
        """An engine answered ``call`` with garbage: the engine's fault, never the caller's.
        The call is placed again like one whose link broke; the engine's process is taken out
        of rotation and restarted by its runner (logged there, ``engine_answers_broken``)."""
        assert isinstance(placement, tuple)
        engine, generation = placement
        self._limited.log(self._log, "warning", "door_reply_rejected", key=engine, engine=engine,
                          method=call.method, error=why)
        self.seats[engine].answered_garbage(generation, why)

    def _proved(self, call: Call, request: bytes, reply: bytes | None, code: str) -> None:
        """Measure a ``Prove`` as its caller gets it: the reply (its kind, result and cuzk's
        timings), or the gRPC code it ended with -- relayed, refused or cancelled."""
        if call.method == "Prove":
            self._metrics.proved(self.plan.name, request, reply, code)

    def _answered(self, caller: _Caller, request: bytes, reply: bytes | None,
                  code: str) -> None:
        """An engine's answer is relayed: measured, and counted late when it comes after a
        deadline call's deadline (its kind's, or its caller's if earlier)."""
        call = caller.call
        self._proved(call, request, reply, code)
        if self._book.answered_late(call, caller.arrived, self._clock()):
            self._metrics.answered_late(self.plan.name, call.kind)

    async def _send(self, call: Call, path: str, request: bytes, placement: Target,
                    context: CallContext) -> SendResult:
        engine, generation = placement
        timeout = read_timeout(call.method, context.time_remaining())
        return await self.seats[engine].send(path, request, generation, timeout)

    async def _answer(self, caller: _Caller, request: bytes, engine: str,
                      answer: bytes | grpc.aio.AioRpcError, context: CallContext) -> bytes:
        """Report how the engine answered, then pass its answer on: the reply's bytes, its
        gRPC error, or (GetStatus/GetMetrics) the last good reply instead of an error."""
        call = caller.call
        if isinstance(answer, bytes):
            job = submitted_job(answer) if call.method == "SubmitProof" and not call.job else ""
            self._returned(call, Outcome.OK, job, answer)
            self._answered(caller, request, answer, grpc.StatusCode.OK.name)
            self._replies.replied(call.method, engine, answer)
            return answer
        self._returned(call, Outcome.ERROR, answer=answer)
        self._answered(caller, request, None, answer.code().name)
        if (last := self._reading(call.method)) is not None:
            return last
        raise GrpcError(answer.code(), answer.details() or "")

    async def _echo(self, caller: _Caller, request: bytes, answer: Answer,
                    context: CallContext) -> bytes:
        """Answer a call that joined another with that one's answer (the same request: the
        same proof)."""
        if isinstance(answer, bytes):
            self._answered(caller, request, answer, grpc.StatusCode.OK.name)
            return answer
        self._answered(caller, request, None, answer.code().name)
        raise GrpcError(answer.code(), answer.details() or "")

    async def _to_every(self, call: Call, path: str, request: bytes, targets: list[Target],
                        context: CallContext) -> bytes:
        """A shared door's status read or preload: sent to each engine at once, answered
        with the good replies merged (a status read also with the last good reply of each
        engine that gave none now). An engine answering garbage is restarted, as for any
        call; one lost under the call is left out. Only when no engine answered is the call
        an error: the first engine's, else ``UNAVAILABLE``."""
        behind = self._replies.behind(call.method, [engine for engine, _ in targets])
        waited: list[Target] = []
        for target in targets:
            if target[0] in behind:
                self._behind.start(self._read_behind(call, path, request, target))
            else:
                waited.append(target)
        results = await asyncio.gather(*(self._send(call, path, request, target, context)
                                         for target in waited))
        replies: dict[str, bytes] = {}
        errors: list[grpc.aio.AioRpcError] = []
        for target, result in zip(waited, results, strict=True):
            if (reply := self._heard(call, target, result)) is not None:
                replies[target[0]] = reply
            elif isinstance(result, grpc.aio.AioRpcError):
                errors.append(result)
        if call.method not in FROM_CACHE:  # PreloadSRS
            if replies:
                return merge_preload(list(replies.values()))
        elif (merged := self._reading(call.method)) is not None:
            return merged
        if errors:
            raise GrpcError(errors[0].code(), errors[0].details() or "")
        raise GrpcError(grpc.StatusCode.UNAVAILABLE,
                     f"{call.method}: every engine behind cuzkd's door ended under the call")

    async def _read_behind(self, call: Call, path: str, request: bytes,
                           target: Target) -> None:
        """A lagging engine's status read that no caller waits for: a good reply is its last
        good reply from then on (and ends its lag)."""
        engine, generation = target
        result = await self.seats[engine].send(path, request, generation, READING_TIMEOUT)
        self._heard(call, target, result, behind=True)

    def _heard(self, call: Call, target: Target, result: SendResult, *,
               behind: bool = False) -> bytes | None:
        """Tell the reply cache how an engine answered a read sent to every engine (or behind
        the callers' backs); its reply, if a good one (garbage restarts it, as for any call)."""
        engine = target[0]
        if isinstance(result, grpc.aio.AioRpcError) \
                and result.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
            self._replies.timed_out(call.method, engine)
        if not isinstance(result, bytes):
            return None
        if why := broken_reply(call.method, result):
            self._broken_answer(call, target, why)
        reply = None if why else result
        self._replies.replied(call.method, engine, reply, behind=behind)
        return reply

    def _reading(self, method: str) -> bytes | None:
        """A ``GetStatus``/``GetMetrics`` answer of the door's engines: the replies standing
        in for each, merged (None: none has answered yet, or not such a read)."""
        replies = self._replies.stand_ins(method)
        if not replies:
            return None
        if method == "GetMetrics":
            return merge_metrics(replies)
        return merge_status([reply for _, reply in replies])

    async def _from_cache(self, method: str,
                          context: CallContext) -> bytes:
        last = self._reading(method)
        if last is None:
            raise GrpcError(grpc.StatusCode.UNAVAILABLE,
                         f"{method}: no engine behind cuzkd's door can answer now, and none "
                         f"has answered it yet ({', '.join(self.plan.engines)} starting or "
                         "stopped)")
        return last

    async def closing(self, timeout: float) -> None:
        """cuzkd's process is about to exit: every call still held or on an engine is refused
        now, naming the restart (the engines have stopped), and so is every call that comes
        from now on; returns once every caller has its answer, or after ``timeout`` seconds."""
        self._closed = True
        self._carry_out(self._book.closed(self._clock()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._quiet.wait(), timeout)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        await self._behind.cancel_all()
        for seat in self.seats.values():
            await seat.close()
