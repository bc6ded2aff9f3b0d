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
last good reply is given again, else a clear ``UNAVAILABLE``. Requests that do not decode as
their method's message get ``INVALID_ARGUMENT``, an unknown method ``UNIMPLEMENTED``, a message
over the size limit grpc's ``RESOURCE_EXHAUSTED``: the engines never see them.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import NoReturn

import grpc
import structlog

from cuzkd.config.doors import DoorPlan
from cuzkd.supervisor.core.doorbook import CallFacts, Decision, DoorBook, Refuse, Send
from cuzkd.supervisor.door.requests import (
    READINGS,
    REQUESTS,
    SERVICE,
    BadRequest,
    method_name,
    read_facts,
)
from cuzkd.supervisor.door.seat import LOST, EngineSeat

log = structlog.get_logger("cuzkd.supervisor")

#: How long ``GetStatus``/``GetMetrics`` wait for an engine before the last good reply is
#: given instead (cuzk's GetStatus runs nvidia-smi: tens of milliseconds).
READING_TIMEOUT = 5.0


class Door:
    """One :class:`~cuzkd.config.doors.DoorPlan`'s server, book and seats."""

    def __init__(self, plan: DoorPlan, clock: Callable[[], float]) -> None:
        self.plan = plan
        self._clock = clock
        self._book = DoorBook(plan, clock())
        self.seats = {name: EngineSeat(name, plan.max_message_bytes, self)
                      for name in plan.engines}
        self._ids = itertools.count(1)
        #: call id -> its mailbox while its caller waits: where to send it (an engine and
        #: its process's generation, taken when the book decided), or why it is refused
        self._mail: dict[int, asyncio.Queue[tuple[str, int] | Refuse]] = {}
        #: method -> the last good reply's bytes (GetStatus, GetMetrics)
        self._last_reading: dict[str, bytes] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._log = log.bind(door=plan.name, address=plan.address)

    # -- the seats' owner: what the runners say ------------------------------------------

    def admitted(self, engine: str) -> None:
        self._log.info("door_engine_admitted", engine=engine)
        self._carry_out(self._book.admit(self._clock(), engine))

    def stopped_admitting(self, engine: str) -> None:
        self._carry_out(self._book.stop_admitting(self._clock(), engine))

    def in_flight(self, engine: str) -> int:
        return self._book.in_flight(engine)

    def left(self, engine: str, crashed: bool) -> None:
        self._carry_out(self._book.gone(self._clock(), engine, crashed=crashed))

    def refuse_new(self) -> None:
        """cuzkd shuts down: held and new calls are refused at once (calls in flight go on
        until their engines stop)."""
        self._carry_out(self._book.shutdown(self._clock()))

    # -- the book's decisions --------------------------------------------------------------

    def _carry_out(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            # a Hold needs nothing: the call waits on its mailbox until it is placed
            match decision:
                case Send(call=call, engine=engine) if call in self._mail:
                    self._mail[call].put_nowait((engine, self.seats[engine].generation))
                case Refuse(call=call) if call in self._mail:
                    self._mail[call].put_nowait(decision)
        self._arm_timer()

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
        self._carry_out(self._book.expire(self._clock()))

    # -- the calls -------------------------------------------------------------------------

    async def relay(self, path: str, request: bytes,
                    context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        """One call from Curio: its reply's bytes, or an abort with a gRPC status."""
        method = method_name(path)
        if method is None:
            await _abort(context, grpc.StatusCode.UNIMPLEMENTED,
                         f"unknown method {path}: the door serves {SERVICE} "
                         f"({', '.join(REQUESTS)})")
        try:
            facts = read_facts(method, request)
        except BadRequest as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {exc}")
        if method in READINGS:
            return await self._reading(path, method, request, context)
        return await self._placed(path, facts, request, context)

    async def _placed(self, path: str, facts: CallFacts, request: bytes,
                      context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        """A call the book places: sent, held until an engine takes it, or refused."""
        call = next(self._ids)
        mailbox: asyncio.Queue[tuple[str, int] | Refuse] = asyncio.Queue()
        self._mail[call] = mailbox
        answered = False
        try:
            self._carry_out(self._book.arrive(self._clock(), call, facts, len(request)))
            while True:
                decision = await mailbox.get()
                if isinstance(decision, Refuse):
                    answered = True
                    await _abort(context, grpc.StatusCode.UNAVAILABLE,
                                 f"{facts.method}: {decision.message}")
                engine, generation = decision
                outcome = await self.seats[engine].send(path, request, generation,
                                                        context.time_remaining())
                if outcome is LOST:
                    continue  # the engine died under it: the book's next decision places it
                answered = True
                self._carry_out(self._book.answered(self._clock(), call))
                if isinstance(outcome, grpc.aio.AioRpcError):
                    await _abort(context, outcome.code(), outcome.details() or "")
                assert isinstance(outcome, bytes)
                return outcome
        finally:
            del self._mail[call]
            if not answered:  # its caller went away (cancelled, deadline): forget it
                self._carry_out(self._book.abandoned(self._clock(), call))

    async def _reading(self, path: str, method: str, request: bytes,
                       context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        """GetStatus/GetMetrics from an engine that takes calls, else the last good reply."""
        for name in self._book.admitting():
            seat = self.seats[name]
            outcome = await seat.send(path, request, seat.generation, READING_TIMEOUT)
            if isinstance(outcome, bytes):
                self._last_reading[method] = outcome
                return outcome
        last = self._last_reading.get(method)
        if last is None:
            await _abort(context, grpc.StatusCode.UNAVAILABLE,
                         f"{method}: no engine behind the door has answered it yet "
                         f"({', '.join(self.plan.engines)} not taking calls)")
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

