"""An engine's seat behind a front door: what its runner tells the door, and asks it.

A cuzk engine behind a door (docs/operations.md, "The front door") is reached by Curio only
through the door, a gRPC server in the supervisor (:mod:`cuzkd.supervisor.door`). The runner
knows when the engine can take calls, when it must stop taking them, how its process ended and
what the engine shows of its work; the door knows which calls it holds. This protocol is the
whole of what passes between them, so the runner never imports the door (the door is the layer
above) and its tests give it a seat of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from cuzkd.supervisor.core.doorbook import EngineEnd, EngineReading

#: What a seat calls when the engine's process answers gRPC calls with bytes that are not
#: cuzk's messages (the reason in words): the runner kills it and starts another.
BrokenAnswers = Callable[[str], None]


class DoorSeat(Protocol):
    """One engine's place behind a door, implemented by the door."""

    def admit(self, address: str, broken: BrokenAnswers) -> None:
        """The engine is ready (its first answer): send it calls at its private gRPC
        ``address`` (held calls first). ``broken``: to be called, once, if this process
        answers with bytes that are not cuzk's messages."""
        ...

    def adopted(self, broken: BrokenAnswers) -> None:
        """The process admitted before ``cuzkd upgrade`` goes on taking calls, now this
        program's: ``broken`` is its hook (see :meth:`admit`)."""
        ...

    def stop_admitting(self, drain_left: float | None) -> None:
        """A stop of the engine began: no new call goes to it (calls it has run on).
        ``drain_left``: an operator's stop drains for this many seconds more, and a deadline
        call no other engine can take may still go to it meanwhile (None: a stop closed to
        them, as for an unhealthy or stalled engine)."""
        ...

    def in_flight(self) -> int:
        """Calls relayed to the engine and not yet answered, plus jobs it took by
        ``SubmitProof`` whose ``AwaitProof`` has not returned, less those it showed it no
        longer has: what a stop now would lose."""
        ...

    def wants_reading(self) -> bool:
        """Whether the door waits on a reading of the engine's ``/status`` (its fresh
        process's first job keeps PoSts away until it shows partition 0 past the GPU queue)."""
        ...

    def reading(self, reading: EngineReading) -> None:
        """What a read of the engine showed (``/status``, and ``GetStatus`` while it drains)."""
        ...

    def gone(self, end: EngineEnd) -> None:
        """The engine's process ended, as ``end`` says: its calls still in flight are sent
        again, once (after a crash, as suspects)."""
        ...
