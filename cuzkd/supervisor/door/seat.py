"""One engine's seat behind a door: the raw channel to its private address, the calls on it.

It implements the engines layer's :class:`~cuzkd.supervisor.engines.seat.DoorSeat` for the
runner (admit, stop admitting, in flight, readings, gone) and carries the door's relayed calls
to the engine as raw bytes (``channel.unary_unary(method)`` with no serializers: nothing is
decoded or encoded again). Which call goes where is the door's book's decision; the seat only
sends, and knows which process a call went to: a call sent to a process that is gone is
*lost* (:attr:`Unanswered.LOST`), never an error for the caller, so the book can place it again.

grpc reports an engine's own ``UNAVAILABLE`` answer and a dead engine alike, so the seat
decides by the process: a call that failed ``UNAVAILABLE``/``CANCELLED`` is the engine's answer
if its process lives and its channel is ready again within :data:`OWN_ANSWER_WAIT`; only an
exit the reaper saw (:attr:`Unanswered.LOST`) or a channel that does not come back
(:attr:`Unanswered.BROKEN`) is a failure of the link.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any, Protocol

import grpc

from cuzkd.supervisor.core.doorbook import EngineEnd, EngineReading
from cuzkd.supervisor.engines.seat import BrokenAnswers
from cuzkd.supervisor.tasks import TaskSet


class Unanswered(enum.Enum):
    """Why :meth:`EngineSeat.send` has no answer of the engine's to give."""

    #: the engine's process ended under the call (the book, told by the runner, has placed it
    #: again already)
    LOST = "lost"
    #: the call's link broke and the process lives on: the book is to be told
    BROKEN = "broken"


#: What :meth:`EngineSeat.send` returns: the engine's reply, its gRPC error, or why there is none.
SendResult = bytes | grpc.aio.AioRpcError | Unanswered

#: How long a call that failed as a broken link would watches its engine's connection: one
#: that stays up this long was the engine's own answer (a dying process's connection drops
#: within milliseconds, and its channel shows it a moment after the call's failure).
SETTLE = 0.2
#: How long after that failure a connection that dropped may come back, the process alive:
#: then too the failure was the engine's own.
OWN_ANSWER_WAIT = 1.0
#: How long it waits in all for the process's end when the connection does not come back (the
#: reaper sees an exit within milliseconds; a loaded host, later): then the call is lost with
#: the process, and the book learns how the process ended before placing it again.
LOSS_WAIT = 5.0
#: The reads whose empty request asks the engine the same whoever sends it: callers at once
#: share one.
SHARED_READS = frozenset({"/cuzk.v1.ProvingEngine/GetStatus",
                          "/cuzk.v1.ProvingEngine/GetMetrics"})
#: How long a shared read's reply also answers those who ask after it: a flood back to back
#: costs the engine one read (30 ms of cuzk's ``nvidia-smi``) per this, not one after another;
#: Curio polls every few seconds and cannot tell.
REUSE = 0.25
#: The codes grpc gives a call whose link failed (no answer of the engine's).
LINK_FAILED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


class SeatOwner(Protocol):
    """The door a seat belongs to: what the runner says of the engine goes to its book."""

    def admit(self, engine: str) -> None: ...

    def stop_admitting(self, engine: str, drain_left: float | None) -> None: ...

    def in_flight(self, engine: str) -> int: ...

    def wants_reading(self, engine: str) -> bool: ...

    def reading(self, engine: str, reading: EngineReading) -> None: ...

    def gone(self, engine: str, end: EngineEnd) -> None: ...


class EngineSeat:
    """An engine behind the door ``owner``."""

    def __init__(self, name: str, max_message_bytes: int, owner: SeatOwner) -> None:
        self.name = name
        self._options = [("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.max_send_message_length", max_message_bytes)]
        self._owner = owner
        self._channel: grpc.aio.Channel | None = None
        #: which process of the engine a call went to (one more at each exit)
        self.generation = 0
        self._ended = asyncio.Event()
        self._calls: set[grpc.aio.UnaryUnaryCall[bytes, bytes]] = set()
        #: (method, process) -> the status read under way that callers share
        self._reads: dict[tuple[str, int], asyncio.Future[SendResult]] = {}
        #: each shared read's last reply: (when it came, its generation, its bytes)
        self._replies: dict[str, tuple[float, int, bytes]] = {}
        self._tasks = TaskSet()
        #: the runner's hook for this process's broken answers; None once called (or before
        #: the first admit): one restart per process, however many calls saw it
        self._broken: BrokenAnswers | None = None

    # -- the runner's side (DoorSeat) ----------------------------------------------------

    def admit(self, address: str, broken: BrokenAnswers) -> None:
        self._channel = grpc.aio.insecure_channel(address, options=self._options)
        self._ended = asyncio.Event()
        self._broken = broken
        self._owner.admit(self.name)

    def adopted(self, broken: BrokenAnswers) -> None:
        self._broken = broken

    def stop_admitting(self, drain_left: float | None) -> None:
        self._owner.stop_admitting(self.name, drain_left)

    def in_flight(self) -> int:
        return self._owner.in_flight(self.name)

    def wants_reading(self) -> bool:
        return self._owner.wants_reading(self.name)

    def reading(self, reading: EngineReading) -> None:
        self._owner.reading(self.name, reading)

    def gone(self, end: EngineEnd) -> None:
        """The process ended: every call on it is lost (the book places them again), the
        channel closed."""
        self.generation += 1
        channel, self._channel = self._channel, None
        self._ended.set()
        self._owner.gone(self.name, end)
        for call in list(self._calls):
            call.cancel()
        if channel is not None:
            self._tasks.start(channel.close())

    # -- the door's side -------------------------------------------------------------------

    async def send(self, method: str, request: bytes, generation: int,
                   timeout: float | None) -> SendResult:
        """Relay one call to the process of ``generation`` (the one the book placed it on):
        its reply's bytes, its gRPC error, :attr:`Unanswered.LOST` when that process is gone,
        or :attr:`Unanswered.BROKEN` when no answer came from it. Callers asking the same
        status read at once share one call to the engine (:data:`SHARED_READS`), and its
        reply answers those who ask within :data:`REUSE` after it: a flood of them costs the
        engine one ``nvidia-smi`` at a time, and a few a second."""
        if method not in SHARED_READS or request:
            return await self._relay(method, request, generation, timeout)
        now = asyncio.get_running_loop().time()
        if (last := self._replies.get(method)) and last[1] == generation \
                and now - last[0] < REUSE:
            return last[2]
        key = (method, generation)
        if (read := self._reads.get(key)) is None:
            read = self._reads[key] = asyncio.ensure_future(
                self._relay(method, request, generation, timeout))
            read.add_done_callback(lambda done: self._read_done(method, generation, done))
        return await asyncio.shield(read)

    def _read_done(self, method: str, generation: int, read: asyncio.Future[SendResult]) -> None:
        self._reads.pop((method, generation), None)
        if not read.cancelled() and read.exception() is None \
                and isinstance(reply := read.result(), bytes):
            self._replies[method] = (asyncio.get_running_loop().time(), generation, reply)

    async def _relay(self, method: str, request: bytes, generation: int,
                     timeout: float | None) -> SendResult:
        channel = self._channel
        if channel is None or generation != self.generation:
            return Unanswered.LOST
        relay: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
        call = relay(request, timeout=timeout, wait_for_ready=True)
        self._calls.add(call)
        try:
            reply: bytes = await call
            return reply
        except asyncio.CancelledError:
            if generation != self.generation and not _cancelling():
                return Unanswered.LOST
            raise
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in LINK_FAILED:
                return exc
            serves_on = await self._serves_on(channel, generation)
            if generation != self.generation:
                return Unanswered.LOST
            return exc if serves_on else Unanswered.BROKEN
        finally:
            self._calls.discard(call)
            call.cancel()

    async def _serves_on(self, channel: grpc.aio.Channel, generation: int) -> bool:
        """Whether the process of ``generation`` serves on after a call's UNAVAILABLE or
        CANCELLED -- its own answer: its connection stayed up for :data:`SETTLE`, or dropped
        and came back within :data:`OWN_ANSWER_WAIT`, and the reaper saw no exit. Otherwise it
        waits, :data:`LOSS_WAIT` in all, for the process's end, and returns False (at once when
        the process ends)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        ended = asyncio.ensure_future(self._ended.wait())
        try:
            state = channel.get_state(try_to_connect=True)
            if (state is grpc.ChannelConnectivity.READY
                    and not await self._changes(channel, state, ended, SETTLE)):
                return generation == self.generation  # up throughout: its own answer
            while generation == self.generation:
                state = channel.get_state(try_to_connect=True)
                left = started + OWN_ANSWER_WAIT - loop.time()
                if state is grpc.ChannelConnectivity.READY or left <= 0:
                    break
                await self._changes(channel, state, ended, left)
            if state is grpc.ChannelConnectivity.READY and generation == self.generation:
                return True  # back: the engine lives and serves
            await asyncio.wait({ended}, timeout=max(0.0, started + LOSS_WAIT - loop.time()))
            return False
        finally:
            ended.cancel()

    @staticmethod
    async def _changes(channel: grpc.aio.Channel, state: grpc.ChannelConnectivity,
                       ended: asyncio.Future[Any], within: float) -> bool:
        """Whether the channel leaves ``state`` (or the process ends) within ``within`` s."""
        changed = asyncio.ensure_future(channel.wait_for_state_change(state))
        try:
            done, _ = await asyncio.wait({changed, ended}, timeout=within,
                                         return_when=asyncio.FIRST_COMPLETED)
            return bool(done)
        finally:
            changed.cancel()

    def answered_garbage(self, generation: int, why: str) -> None:
        """The process of ``generation`` answered a call with bytes that are not cuzk's
        messages: out of rotation at once (no new call goes to it), and its runner told, once,
        to kill it and start another; the call itself is the book's to place again."""
        if generation != self.generation or self._broken is None:
            return
        broken, self._broken = self._broken, None
        self._owner.stop_admitting(self.name, None)
        broken(why)

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()
        await self._tasks.cancel_all()


def _cancelling() -> bool:
    """The current task itself is being cancelled (its caller went away), not only the call."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
