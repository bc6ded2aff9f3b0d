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
its last good reply. Requests that do not decode as
their method's message get ``INVALID_ARGUMENT``, an unknown method ``UNIMPLEMENTED``, a message
over the size limit grpc's ``RESOURCE_EXHAUSTED``: the engines never see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import NoReturn

import grpc
import structlog

from cuzkd.config.doors import DoorPlan
from cuzkd.errortext import error_text
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.metrics.door_metrics import DoorMetrics
from cuzkd.states import HoldEnd
from cuzkd.supervisor.core.doorbook import (
    FROM_CACHE,
    Broadcast,
    Call,
    Decision,
    DoorBook,
    FromCache,
    Hold,
    Outcome,
    Refuse,
    Send,
    Withdrawn,
)
from cuzkd.supervisor.door.merge import merge_metrics, merge_preload, merge_status
from cuzkd.supervisor.door.requests import (
    REQUESTS,
    SERVICE,
    BadRequest,
    broken_reply,
    method_name,
    read_call,
    submitted_job,
)
from cuzkd.supervisor.door.seat import BROKEN, LOST, EngineSeat

log = structlog.get_logger("cuzkd.supervisor")

#: How long ``GetStatus``/``GetMetrics`` wait for an engine before the last good reply is
#: given instead (cuzk's GetStatus runs nvidia-smi: tens of milliseconds).
READING_TIMEOUT = 5.0

#: Where a call goes: an engine's process, by its generation when the book decided.
Target = tuple[str, int]
#: What a waiting call is told next: send it (to one process, or to each of a list and merge
#: their replies), refuse it, or answer it from the last good reply.
Placement = Target | list[Target] | Refuse | FromCache


class Door:
    """One :class:`~cuzkd.config.doors.DoorPlan`'s book and seats (its server is
    :class:`~.doors.Doors`')."""

    def __init__(self, plan: DoorPlan, clock: Callable[[], float],
                 metrics: DoorMetrics) -> None:
        self.plan = plan
        self._clock = clock
        self._metrics = metrics
        self._book = DoorBook(hold_timeout=plan.hold_timeout,
                              hold_max_calls=plan.hold_max_calls,
                              hold_max_bytes=plan.hold_max_bytes,
                              retry_max_bytes=plan.retry_max_bytes,
                              engines=plan.engines)
        self.seats = {name: EngineSeat(name, plan.max_message_bytes, self)
                      for name in plan.engines}
        self._ids = itertools.count(1)
        #: call id -> its mailbox while its caller waits (see :data:`Placement`)
        self._mail: dict[int, asyncio.Queue[Placement]] = {}
        #: (method, engine) -> that engine's last good reply's bytes (GetStatus, GetMetrics)
        self._last_reading: dict[tuple[str, str], bytes] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._log = log.bind(door=plan.name)
        #: refusals log once per 10 s per reason (a full door refuses every call)
        self._limited = LimitedLog()

    # -- the seats' owner: what the runners say ------------------------------------------

    # These run inside the runner's own handling (its exit, its state changes): whatever goes
    # wrong in the door is logged here and never breaks the engine's supervision.

    def admitted(self, engine: str) -> None:
        self._log.info("door_engine_admitted", engine=engine, held=self._book.held_calls)
        with self._guarded("admitting", engine):
            self._carry_out(self._book.admitting(engine, self._clock()))

    def stopped_admitting(self, engine: str) -> None:
        with self._guarded("stop_admitting", engine):
            self._book.stop_admitting(engine)

    def in_flight(self, engine: str) -> int:
        return self._book.in_flight(engine)

    def left(self, engine: str, crashed: bool) -> None:
        with self._guarded("gone", engine):
            self._carry_out(self._book.gone(engine, self._clock(), crashed=crashed))

    @contextlib.contextmanager
    def _guarded(self, event: str, engine: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # a bug: the door's, not the engine's
            self._log.error("door_book_failed", engine=engine, on=event,
                            error=error_text(exc), exc_info=exc)

    def refuse_new(self) -> None:
        """cuzkd shuts down: held and new calls are refused at once (calls in flight go on
        until their engines stop)."""
        self._carry_out(self._book.shutting_down(self._clock()))

    # -- the book's decisions --------------------------------------------------------------

    def _carry_out(self, decisions: list[Decision]) -> None:
        """Hand each decision to its call's mailbox. A Hold needs nothing (the call waits on
        its mailbox; an attempt under way for it was lost already), nor a Withdrawn (its
        caller left)."""
        for decision in decisions:
            mailbox = self._mail.get(decision.call)
            self._count(decision)
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
                case Hold(retry=retry) if retry is not None:
                    self._log.info("door_retry_deferred", call=decision.call,
                                   reason=str(retry))
        self._metrics.held(self.plan.name, self._book.held_calls)
        self._arm_timer()

    def _count(self, decision: Decision) -> None:
        """The door's own figures of a decision: hold times, retries, refusals. A retry is
        counted where it is decided: sent at once, or held for the engine's next process."""
        door, metrics = self.plan.name, self._metrics
        match decision:
            case Send(held_for=held_for) | Broadcast(held_for=held_for) if held_for is not None:
                metrics.hold_ended(door, held_for, HoldEnd.PLACED)
            case Refuse(held_for=held_for) if held_for is not None:
                metrics.hold_ended(door, held_for, HoldEnd.REFUSED)
            case Withdrawn(held_for=held_for):
                metrics.hold_ended(door, held_for, HoldEnd.CANCELLED)
        match decision:
            case Send(retry=retry) | Hold(retry=retry) if retry is not None:
                metrics.retried(door, retry)
            case Refuse(reason=reason):
                metrics.refused(door, reason)

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

    def _returned(self, call: Call, outcome: Outcome, job: str = "") -> None:
        self._carry_out(self._book.returned(call.id, self._clock(), outcome, job))

    # -- the calls -------------------------------------------------------------------------

    async def relay(self, path: str, request: bytes,
                    context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        """One call from Curio: its reply's bytes, or an abort with a gRPC status."""
        method = method_name(path)
        if method is None:
            await _abort(context, grpc.StatusCode.UNIMPLEMENTED,
                         f"unknown method {path[:200]}: cuzkd's door serves {SERVICE} "
                         f"({', '.join(REQUESTS)})")
        try:
            call = read_call(next(self._ids), method, request)
        except BadRequest as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {exc}")
        mailbox: asyncio.Queue[Placement] = asyncio.Queue()
        self._mail[call.id] = mailbox
        ended = False
        try:
            self._carry_out(self._book.arrived(call, self._clock()))
            while True:
                placement = await mailbox.get()
                if isinstance(placement, Refuse):
                    ended = True
                    self._proved(call, request, None, placement.code)
                    await _abort(context, grpc.StatusCode[placement.code],
                                 f"{method}: {placement.message}")
                if isinstance(placement, FromCache):
                    ended = True
                    return await self._from_cache(method, context)
                if isinstance(placement, list):
                    ended = True
                    return await self._to_every(call, path, request, placement, context)
                outcome = await self._send(call, path, request, placement, context)
                if isinstance(outcome, bytes) and (why := broken_reply(method, outcome)):
                    self._broken_answer(call, placement, why)
                    outcome = BROKEN
                if outcome is BROKEN:  # the book places it again, never on that process
                    self._returned(call, Outcome.BROKEN)
                if outcome in (LOST, BROKEN):
                    continue  # its engine died under it: the book's next decision places it
                ended = True
                return await self._answer(call, request, placement[0], outcome, context)
        finally:
            del self._mail[call.id]
            if not ended:  # its caller went away (cancelled, deadline): the book forgets it
                self._returned(call, Outcome.CANCELLED)
                self._proved(call, request, None, grpc.StatusCode.CANCELLED.name)

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

    async def _send(self, call: Call, path: str, request: bytes, placement: Target,
                    context: grpc.aio.ServicerContext[bytes, bytes]) -> object:
        engine, generation = placement
        timeout = context.time_remaining()
        if call.method in FROM_CACHE:
            timeout = min(timeout or READING_TIMEOUT, READING_TIMEOUT)
        return await self.seats[engine].send(path, request, generation, timeout)

    async def _answer(self, call: Call, request: bytes, engine: str, outcome: object,
                      context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        """Report how the engine answered, then pass its answer on: the reply's bytes, its
        gRPC error, or (GetStatus/GetMetrics) the last good reply instead of an error."""
        if isinstance(outcome, bytes):
            job = submitted_job(outcome) if call.method == "SubmitProof" and not call.job else ""
            self._returned(call, Outcome.OK, job)
            self._proved(call, request, outcome, grpc.StatusCode.OK.name)
            if call.method in FROM_CACHE:
                self._last_reading[call.method, engine] = outcome
            return outcome
        assert isinstance(outcome, grpc.aio.AioRpcError)
        self._returned(call, Outcome.ERROR)
        self._proved(call, request, None, outcome.code().name)
        if call.method in FROM_CACHE and (last := self._reading(call.method)) is not None:
            return last
        await _abort(context, outcome.code(), outcome.details() or "")

    async def _to_every(self, call: Call, path: str, request: bytes, targets: list[Target],
                        context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        """A shared door's status read or preload: sent to each engine at once, answered
        with the good replies merged (a status read also with the last good reply of each
        engine that gave none now). An engine answering garbage is restarted, as for any
        call; one lost under the call is left out. Only when no engine answered is the call
        an error: the first engine's, else ``UNAVAILABLE``."""
        outcomes = await asyncio.gather(*(self._send(call, path, request, target, context)
                                          for target in targets))
        replies: dict[str, bytes] = {}
        errors: list[grpc.aio.AioRpcError] = []
        for target, outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, bytes) and (why := broken_reply(call.method, outcome)):
                self._broken_answer(call, target, why)
            elif isinstance(outcome, bytes):
                replies[target[0]] = outcome
            elif isinstance(outcome, grpc.aio.AioRpcError):
                errors.append(outcome)
        if call.method not in FROM_CACHE:  # PreloadSRS
            if replies:
                return merge_preload(list(replies.values()))
        else:
            self._last_reading.update(((call.method, e), r) for e, r in replies.items())
            if (merged := self._reading(call.method)) is not None:
                return merged
        if errors:
            await _abort(context, errors[0].code(), errors[0].details() or "")
        await _abort(context, grpc.StatusCode.UNAVAILABLE,
                     f"{call.method}: every engine behind cuzkd's door ended under the call")

    def _reading(self, method: str) -> bytes | None:
        """A ``GetStatus``/``GetMetrics`` answer of the door's engines: the last good reply of
        each, merged (None: none has answered yet)."""
        replies = [(engine, self._last_reading[method, engine]) for engine in self.plan.engines
                   if (method, engine) in self._last_reading]
        if not replies:
            return None
        if method == "GetMetrics":
            return merge_metrics(replies)
        return merge_status([reply for _, reply in replies])

    async def _from_cache(self, method: str,
                          context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        last = self._reading(method)
        if last is None:
            await _abort(context, grpc.StatusCode.UNAVAILABLE,
                         f"{method}: no engine behind cuzkd's door can answer now, and none "
                         f"has answered it yet ({', '.join(self.plan.engines)} starting or "
                         "stopped)")
        return last

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for seat in self.seats.values():
            await seat.close()


async def _abort(context: grpc.aio.ServicerContext[bytes, bytes], code: grpc.StatusCode,
                 message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("abort returned")  # grpc raises; for the type checker


class DoorHandler(grpc.GenericRpcHandler):
    """Every method path, relayed by the door as raw bytes (no (de)serializers)."""

    def __init__(self, door: Door) -> None:
        self._door = door

    def service(self, handler_call_details: grpc.HandlerCallDetails
                ) -> grpc.RpcMethodHandler[bytes, bytes]:
        path = handler_call_details.method

        async def behaviour(request: bytes,
                            context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            return await self._door.relay(path, request, context)

        return grpc.unary_unary_rpc_method_handler(behaviour)

