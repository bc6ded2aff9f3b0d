"""The private channel between the supervisor and its door process: a Unix socket in the state
dir, 0600, that the supervisor listens on and its door process dials (it names its pid, and
anything else is told to close); length-prefixed JSON messages of a versioned, closed
vocabulary, each at most :data:`MAX_MESSAGE` bytes, and at most :data:`BACKLOG` unsent on
either side.

What crosses it is small and never a call's bytes: the supervisor tells the door how its
engines stand (admitted at a private address, draining with so much time left, gone and how,
each naming the engine's process by its serial), hands it a draining engine's readings, and
asks it for what the control API and a scrape show; the door tells the supervisor each
engine's calls in flight and whether it waits on a reading (pushed on change, so a drain reads
them without a round trip), an engine that answered garbage, and its figures. Either side
survives the other's restart: a door process that loses its channel serves on and dials again
(:data:`ORPHAN_GRACE` at most), and each connection starts with the whole state
(:class:`Setup`, then each engine's last end, admission and stop: idempotent by serial); a new
door process is told the same; the supervisor keeps the figures of a door process that died.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgspec

from cuzkd.cuzk.reading import KindQueue, QueueReading
from cuzkd.errors import ChannelClosed
from cuzkd.metrics.door_metrics import DoorFigures
from cuzkd.supervisor.core.doorbook import EngineReading

#: The vocabulary's version: both sides send it first (:class:`Hello`); a door process of
#: another version is ended and a new one spawned.
VERSION = 1
#: The largest message either side sends or accepts (a reading lists a busy engine's job ids).
MAX_MESSAGE = 4 << 20
#: Past this much unsent to the other side (frozen, or stuck), a side drops the channel rather
#: than queue more: the door process dials again and is told the whole state.
BACKLOG = 1 << 20
#: How long a door process serves on without its supervisor's channel, dialling again, before
#: it refuses what it holds and ends.
ORPHAN_GRACE = 30.0
_LENGTH = struct.Struct("!I")


class Hello(msgspec.Struct, tag=True):
    version: int
    pid: int


class ServerLimits(msgspec.Struct, frozen=True):
    """A door process's bounds on what its callers may take (:mod:`.server`'s)."""

    max_connections: int
    max_streams: int
    max_header_list_bytes: int
    request_bytes: int
    connection_request_bytes: int
    reply_bytes: int
    preface_timeout: float
    idle_timeout: float
    #: the door process's data memory, at most (RLIMIT_DATA)
    memory_max: int


class DoorSetup(msgspec.Struct, frozen=True):
    """One door, as :class:`cuzkd.config.doors.DoorPlan` plans it, and the descriptor of its
    listening socket (inherited by the door process)."""

    address: str
    engines: tuple[str, ...]
    fd: int
    hold_timeout: float
    hold_max_calls: int
    hold_max_bytes: int
    retry_max_bytes: int
    deadlines: dict[str, float]
    allowances: dict[str, float]
    quarantine: float
    one_post: tuple[str, ...]
    max_message_bytes: int


class Setup(msgspec.Struct, tag=True):
    """Everything a new door process needs: its doors and its bounds."""

    doors: list[DoorSetup]
    limits: ServerLimits


class Admit(msgspec.Struct, tag=True):
    """``engine``'s process number ``serial`` answers at its private gRPC ``address``."""

    engine: str
    address: str
    serial: int


class StopAdmitting(msgspec.Struct, tag=True):
    """A stop of ``engine``'s process ``serial`` began; ``drain_left``: seconds its drain
    takes deadline calls."""

    engine: str
    drain_left: float | None
    serial: int


class Gone(msgspec.Struct, tag=True):
    """``engine``'s process ``serial`` ended, as ``end`` (an
    :class:`~..core.doorbook.EngineEnd` value)."""

    engine: str
    end: str
    serial: int


class Reading(msgspec.Struct, tag=True):
    """What a read of ``engine`` showed (:class:`~..core.doorbook.EngineReading`)."""

    engine: str
    jobs: list[str] | None
    past_gpu_queue: list[str]
    #: kind -> [pending, in progress]; None: not read; ``queues_error``: why not known
    queues: dict[str, tuple[int, int]] | None
    queues_error: str = ""

    @classmethod
    def of(cls, engine: str, reading: EngineReading) -> Reading:
        queues = reading.queues
        return cls(engine, None if reading.jobs is None else sorted(reading.jobs),
                   sorted(reading.past_gpu_queue),
                   None if queues is None else {kind: (q.pending, q.in_progress)
                                                for kind, q in queues.queues.items()},
                   "" if queues is None else queues.error)

    def reading(self) -> EngineReading:
        queues = None
        if self.queues is not None:
            queues = QueueReading({kind: KindQueue(*counts)
                                   for kind, counts in self.queues.items()},
                                  error=self.queues_error)
        return EngineReading(None if self.jobs is None else frozenset(self.jobs),
                             frozenset(self.past_gpu_queue), queues)


class Close(msgspec.Struct, tag=True):
    """cuzkd exits: refuse what is held or in flight, then end within ``grace`` seconds."""

    grace: float


class Ask(msgspec.Struct, tag=True):
    """A question from the control API (``doors``: each door's state; ``release``: end the
    quarantine of ``request_id``) or a scrape (``figures``: a :class:`Figures` now), answered
    by an :class:`Answer` of the same ``id``."""

    id: int
    what: str
    request_id: str = ""


class EngineState(msgspec.Struct, tag=True):
    """``engine``'s calls and jobs in flight now, and whether the door waits on a reading."""

    engine: str
    in_flight: int
    wants_reading: bool


class Broken(msgspec.Struct, tag=True):
    """``engine``'s process ``serial`` answered a call with bytes that are not cuzk's."""

    engine: str
    serial: int
    why: str


class Figures(msgspec.Struct, tag=True):
    """The door process's counts since it started (:meth:`DoorMetrics.snapshot`)."""

    doors: dict[str, DoorFigures]


class Answer(msgspec.Struct, tag=True):
    id: int
    body: Any


class Ready(msgspec.Struct, tag=True):
    """The door process serves every door of its :class:`Setup`."""


ToDoor = Setup | Admit | StopAdmitting | Gone | Reading | Close | Ask | Hello
FromDoor = Hello | Ready | EngineState | Broken | Figures | Answer

_encoder = msgspec.json.Encoder()
_to_door = msgspec.json.Decoder(ToDoor)
_from_door = msgspec.json.Decoder(FromDoor)


def frame(message: ToDoor | FromDoor) -> bytes:
    body = _encoder.encode(message)
    if len(body) > MAX_MESSAGE:
        raise ValueError(f"a {type(message).__name__} of {len(body)} bytes is over "
                         f"{MAX_MESSAGE}")
    return _LENGTH.pack(len(body)) + body


async def _read_body(reader: asyncio.StreamReader) -> bytes:
    try:
        (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
        if length > MAX_MESSAGE:
            raise ChannelClosed(f"a message of {length} bytes, over {MAX_MESSAGE}")
        return await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise ChannelClosed(f"the channel closed: {exc}") from None


async def read_to_door(reader: asyncio.StreamReader) -> ToDoor:
    try:
        return _to_door.decode(await _read_body(reader))
    except msgspec.DecodeError as exc:
        raise ChannelClosed(f"not a message of the channel: {exc}") from None


async def read_from_door(reader: asyncio.StreamReader) -> FromDoor:
    try:
        return _from_door.decode(await _read_body(reader))
    except msgspec.DecodeError as exc:
        raise ChannelClosed(f"not a message of the channel: {exc}") from None
