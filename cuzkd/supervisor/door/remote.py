"""An engine's seat behind a door that runs in the door process: what its runner says, sent
over the channel, and what the door process last told of the engine, kept here.

The runner calls a seat synchronously from its own handling (an admission, a stop, an exit, a
drain's read): none of it may wait on the door process. So each call here sends a message and
returns; and what the runner asks -- calls in flight, whether the door waits on a reading --
is the door process's last word, pushed to the supervisor whenever it changes
(:class:`~.channel.EngineState`). While no door process runs there is nothing in flight (the
calls died with their connections) and what the runner says is kept: a door process that dials
the channel is told the engine's state again (:meth:`RemoteSeat.replay`).
"""

from __future__ import annotations

from collections.abc import Callable

from cuzkd.supervisor.core.doorbook import EngineEnd, EngineReading
from cuzkd.supervisor.core.handover import SeatState
from cuzkd.supervisor.door.channel import (
    Admit,
    Broken,
    EngineState,
    Gone,
    Reading,
    StopAdmitting,
    ToDoor,
)
from cuzkd.supervisor.engines.seat import BrokenAnswers


class RemoteSeat:
    """One engine behind a door in the door process (the runner's
    :class:`~cuzkd.supervisor.engines.seat.DoorSeat`)."""

    def __init__(self, engine: str, send: Callable[[ToDoor], None],
                 clock: Callable[[], float]) -> None:
        """``send``: to the door process (dropped while none runs); ``clock``: the
        supervisor's, for what is left of a drain when a new door process is told."""
        self.engine = engine
        self._send = send
        self._clock = clock
        #: the process the door may send calls to (None: none admitted), its number
        self._address: str | None = None
        self._serial = 0
        self._broken: BrokenAnswers | None = None
        #: while it is being stopped: the stop's drain takes deadline calls until then
        self._stopping = False
        self._drain_until: float | None = None
        self._in_flight = 0
        self._wants_reading = False
        #: the last process's end, told again with the state (its Gone may have been lost)
        self._last_gone: Gone | None = None

    # -- the runner's side (DoorSeat) ----------------------------------------------------

    def admit(self, address: str, broken: BrokenAnswers) -> None:
        self._serial += 1
        self._address, self._broken, self._stopping = address, broken, False
        self._send(Admit(self.engine, address, self._serial))

    def adopted(self, broken: BrokenAnswers) -> None:
        if self._address is not None:
            self._broken = broken

    def stop_admitting(self, drain_left: float | None) -> None:
        self._stopping = True
        self._drain_until = None if drain_left is None else self._clock() + drain_left
        self._send(StopAdmitting(self.engine, drain_left, self._serial))

    def in_flight(self) -> int:
        return self._in_flight

    def wants_reading(self) -> bool:
        return self._wants_reading

    def reading(self, reading: EngineReading) -> None:
        self._send(Reading.of(self.engine, reading))

    def gone(self, end: EngineEnd) -> None:
        self._address = self._broken = None
        self._stopping, self._in_flight, self._wants_reading = False, 0, False
        self._last_gone = Gone(self.engine, end.value, self._serial)
        self._send(self._last_gone)

    # -- the door process's side ---------------------------------------------------------

    def told(self, state: EngineState) -> None:
        """The door process's word on what it has of the engine."""
        if self._address is not None:
            self._in_flight, self._wants_reading = state.in_flight, state.wants_reading

    def broke(self, broken: Broken) -> None:
        """The door process found the engine's answers are not cuzk's: the runner is told,
        once, if it is still the process that answered."""
        if broken.serial == self._serial and self._broken is not None:
            hook, self._broken = self._broken, None
            hook(broken.why)

    def door_lost(self) -> None:
        """The door process ended: the calls it had died with their connections."""
        self._in_flight, self._wants_reading = 0, False

    # -- cuzkd upgrade ---------------------------------------------------------------------

    def handover(self) -> SeatState:
        """What the door process was told of the engine (no stop is under way: the upgrade's
        gate)."""
        gone = self._last_gone
        return SeatState(self._address, self._serial,
                         None if gone is None else (gone.end, gone.serial))

    def adopt(self, handed: SeatState) -> None:
        """Carry on from the old code's seat: the same process admitted by the same serial,
        so the door process, told the state again, finds nothing new."""
        self._address, self._serial = handed.address, handed.serial
        if handed.last_gone is not None:
            self._last_gone = Gone(self.engine, *handed.last_gone)

    def replay(self) -> list[ToDoor]:
        """What a door process that dials the channel must be told of the engine: how its
        last process ended, its admission, and a stop under way with what is left of its
        drain (each by serial: the door process applies what it has not had)."""
        messages: list[ToDoor] = [] if self._last_gone is None else [self._last_gone]
        if self._address is None:
            return messages
        messages.append(Admit(self.engine, self._address, self._serial))
        if self._stopping:
            left = (None if self._drain_until is None
                    else max(0.0, self._drain_until - self._clock()))
            messages.append(StopAdmitting(self.engine, left, self._serial))
        return messages
