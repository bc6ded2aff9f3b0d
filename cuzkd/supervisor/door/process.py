"""The door process: every front door of a supervisor, in a process of its own.

    python -m cuzkd.supervisor.door.process CHANNEL_PATH

The supervisor spawns it (:mod:`.doors`) as it spawns an engine, hands it each door's listening
socket and lets it dial the supervisor's channel (:mod:`.channel`) at ``CHANNEL_PATH``. Each
door here is a :class:`~.relay.Door` served by cuzkd's own HTTP/2 server (:mod:`.server`), so
whatever a caller sends costs this process, which caps its own memory and offers itself to the
OOM killer first, never the supervisor. One process serves every door: one channel, one set of
bounds and one memory cap to reason about. Its log lines, JSON on stderr, are re-logged by the
supervisor under ``cuzkd.door``. See docs/door.md, *The door's own process, and what a caller
may take of it*, and the *The door process* item of *The shell around the book*.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import sys
import time
from collections.abc import Callable

import structlog

from cuzkd.config.doors import DoorPlan
from cuzkd.errors import ChannelClosed
from cuzkd.log.configure import LogFormat, configure_logging
from cuzkd.metrics.door_metrics import DoorMetrics
from cuzkd.supervisor.core.doorbook import EngineEnd
from cuzkd.supervisor.door.channel import (
    BACKLOG,
    ORPHAN_GRACE,
    VERSION,
    Admit,
    Answer,
    Ask,
    Broken,
    Close,
    DoorSetup,
    EngineState,
    Figures,
    FromDoor,
    Gone,
    Hello,
    Reading,
    Ready,
    Setup,
    StopAdmitting,
    frame,
    read_to_door,
)
from cuzkd.supervisor.door.relay import Door
from cuzkd.supervisor.door.server import GrpcServer, ServerBounds

log = structlog.get_logger("cuzkd.door")

#: How often the door process sends its figures to the supervisor.
FIGURES_EVERY = 1.0
#: The OOM killer's score the door process gives itself (-1000 .. 1000; an engine keeps 0): a
#: flood that grows it is the first thing the kernel ends, never a cuzk.
OOM_SCORE_ADJ = 800
#: The first wait before the channel is dialled again (doubling to 1 s).
CHANNEL_RETRY = 0.05
#: Past this much unsent to the supervisor, the figures sent every FIGURES_EVERY wait: the
#: next ones carry the same counts.
FIGURES_BACKLOG = 64 << 10


def protect_the_host(memory_max: int) -> None:
    """Cap this process's data memory and make it the OOM killer's first choice."""
    with contextlib.suppress(OSError, ValueError):
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = memory_max if hard == resource.RLIM_INFINITY else min(memory_max, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as adj:
        adj.write(str(OOM_SCORE_ADJ))


def plan_of(setup: DoorSetup) -> DoorPlan:
    return DoorPlan(address=setup.address, engines=setup.engines,
                    hold_timeout=setup.hold_timeout,
                    hold_max_calls=setup.hold_max_calls, hold_max_bytes=setup.hold_max_bytes,
                    retry_max_bytes=setup.retry_max_bytes, socket_mode=0, socket_group="",
                    deadlines=setup.deadlines, allowances=setup.allowances,
                    quarantine=setup.quarantine, one_post=frozenset(setup.one_post),
                    max_message_bytes=setup.max_message_bytes)


class DoorProcess:
    """The door process's doors, served across its channel's sessions."""

    def __init__(self) -> None:
        self.metrics = DoorMetrics()
        self._writer: asyncio.StreamWriter | None = None
        self._doors: dict[str, Door] = {}  # engine -> its door
        self._servers: list[tuple[Door, GrpcServer]] = []
        #: engine -> the serial of its process the doors send calls to; those being stopped
        self._admitted: dict[str, int] = {}
        self._stopping: set[str] = set()
        #: engine -> (in flight, wants a reading) last told the supervisor
        self._told: dict[str, tuple[int, bool]] = {}
        self._flush: asyncio.Handle | None = None
        self.closed = asyncio.Event()

    def send(self, message: FromDoor) -> None:
        """To the supervisor; dropped while the channel is down. A supervisor that stopped
        reading (frozen) loses the channel past :data:`~.channel.BACKLOG` unsent: the session
        ends, the process dials again."""
        writer = self._writer
        if writer is None or writer.is_closing():
            return
        if writer.transport.get_write_buffer_size() > BACKLOG:
            log.warning("door_channel_closed", error=f"over {BACKLOG} bytes unsent: the "
                        "supervisor is not reading; dialling again")
            writer.transport.abort()  # a close would wait to send what it cannot
            return
        writer.write(frame(message))

    async def run(self, channel: str) -> int:
        """Dial the supervisor's channel and carry out what it says, again after each break,
        until it says close (0) -- or it cannot be reached for ORPHAN_GRACE (1)."""
        lost_at: float | None = None
        retry = CHANNEL_RETRY
        while not self.closed.is_set():
            try:
                reader, writer = await asyncio.open_unix_connection(channel)
            except OSError as exc:
                lost_at = lost_at if lost_at is not None else time.monotonic()
                if not self._servers or time.monotonic() - lost_at > ORPHAN_GRACE:
                    log.warning("door_channel_closed", error=f"{channel}: {exc}; ending")
                    await self._close(0.0)
                    return 1
                await asyncio.sleep(retry)
                retry = min(retry * 2, 1.0)
                continue
            try:
                await self._session(reader, writer)
            except ChannelClosed as exc:
                if not self.closed.is_set():
                    log.warning("door_channel_closed", error=str(exc))
                    lost_at, retry = time.monotonic(), CHANNEL_RETRY
            finally:
                self._writer = None
                writer.close()
        return 0

    async def _session(self, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        """One connection to the supervisor: hello, the setup (the doors served at the first;
        after, the doors go on as they are), the engines' state, then what it says."""
        self._writer = writer
        self.send(Hello(VERSION, os.getpid()))
        hello = await read_to_door(reader)
        if isinstance(hello, Close):  # not this supervisor's (any more)
            await self._close(hello.grace)
            return
        if not isinstance(hello, Hello) or hello.version != VERSION:
            raise ChannelClosed(f"the supervisor speaks {hello!r}, not version {VERSION}")
        setup = await read_to_door(reader)
        if not isinstance(setup, Setup):
            raise ChannelClosed(f"expected the Setup, got {type(setup).__name__}")
        if not self._servers:
            await self._serve(setup)
        self.send(Ready())
        self._told.clear()  # this supervisor is told every engine's state anew
        self._changed()
        figures = asyncio.get_running_loop().create_task(self._figures())
        try:
            while not self.closed.is_set():
                await self._carry_out(await read_to_door(reader))
        finally:
            figures.cancel()

    async def _serve(self, setup: Setup) -> None:
        limits = setup.limits
        protect_the_host(limits.memory_max)
        bounds = ServerBounds(
            max_connections=limits.max_connections, max_streams=limits.max_streams,
            max_header_list_bytes=limits.max_header_list_bytes,
            request_bytes=limits.request_bytes,
            connection_request_bytes=limits.connection_request_bytes,
            reply_bytes=limits.reply_bytes, preface_timeout=limits.preface_timeout,
            idle_timeout=limits.idle_timeout)
        for door_setup in setup.doors:
            plan = plan_of(door_setup)
            door = Door(plan, time.monotonic, self.metrics, on_change=self._changed)
            for engine in plan.engines:
                self._doors[engine] = door
            self.metrics.opened(plan.name, plan.engines)
            server = GrpcServer(door.relay, bounds, on_bound=self._bound_hit(plan.name))
            await server.serve(socket.socket(fileno=door_setup.fd))
            self._servers.append((door, server))
            log.info("door_serving", door=plan.name, address=plan.address,
                     engines=list(plan.engines))

    def _bound_hit(self, door: str) -> Callable[[str], None]:
        return lambda bound: self.metrics.bound_hit(door, bound)

    async def _carry_out(self, message: object) -> None:
        match message:
            case Admit(engine=engine, address=address, serial=serial):
                self._admit(engine, address, serial)
            case StopAdmitting(engine=engine, drain_left=drain_left, serial=serial):
                if self._admitted.get(engine) == serial and engine not in self._stopping:
                    self._stopping.add(engine)
                    self._doors[engine].seats[engine].stop_admitting(drain_left)
            case Gone(engine=engine, end=end, serial=serial):
                if self._admitted.get(engine) == serial:
                    del self._admitted[engine]
                    self._stopping.discard(engine)
                    self._doors[engine].seats[engine].gone(EngineEnd(end))
            case Reading():
                self._doors[message.engine].seats[message.engine].reading(message.reading())
            case Ask(id=ask_id, what="doors"):
                self.send(Answer(ask_id, [self._describe(door) for door in self._each_door()]))
            case Ask(id=ask_id, what="figures"):
                self._send_figures(always=True)
                self.send(Answer(ask_id, None))
            case Ask(id=ask_id, what="release", request_id=job):
                released = [door.plan.name for door in self._each_door() if door.release(job)]
                self.send(Answer(ask_id, released))
            case Close(grace=grace):
                await self._close(grace)
            case _:
                raise ChannelClosed(f"unexpected {type(message).__name__}")

    def _admit(self, engine: str, address: str, serial: int) -> None:
        """Process ``serial`` of ``engine`` is admitted, unless it already is. One admitted
        before it whose end was never told (the channel was down) ended as a stop: its calls
        go again."""
        admitted = self._admitted.get(engine)
        if admitted == serial:
            return
        seat = self._doors[engine].seats[engine]
        if admitted is not None:
            seat.gone(EngineEnd.STOPPED)
        self._admitted[engine] = serial
        self._stopping.discard(engine)
        seat.admit(address, lambda why: self.send(Broken(engine, serial, why)))

    def _each_door(self) -> list[Door]:
        return [door for door, _ in self._servers]

    def _describe(self, door: Door) -> dict[str, object]:
        now = time.monotonic()
        return {"name": door.plan.name, "address": door.plan.address,
                "engines": list(door.plan.engines), "held_calls": door.held_calls,
                "quarantined": [{"request_id": q.job, "engine": q.engine,
                                 "since_seconds_ago": now - q.since,
                                 "seconds_left": q.until - now} for q in door.quarantined()]}

    def _changed(self) -> None:
        """A door's decisions changed what an engine has in flight: tell the supervisor once
        this turn of the loop is over (a burst of calls is one message per engine)."""
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_soon(self._tell_states)

    def _tell_states(self) -> None:
        self._flush = None
        for engine, door in self._doors.items():
            state = (door.in_flight(engine), door.wants_reading(engine))
            if self._told.get(engine) != state:
                self._told[engine] = state
                self.send(EngineState(engine, *state))

    async def _figures(self) -> None:
        while True:
            await asyncio.sleep(FIGURES_EVERY)
            self._send_figures()

    def _send_figures(self, *, always: bool = False) -> None:
        """The counts to the supervisor; the periodic ones skipped while the channel is
        backed up (``always``: a scrape asked)."""
        for door, server in self._servers:
            self.metrics.connections(door.plan.name, server.connections)
        if self._writer is None:
            return
        if always or self._writer.transport.get_write_buffer_size() < FIGURES_BACKLOG:
            self.send(Figures(self.metrics.snapshot()))

    async def _close(self, grace: float) -> None:
        """cuzkd exits: each door refuses what it has (its GOAWAY first), its server ends."""
        for door, server in self._servers:
            server.goaway()
            await door.closing(grace)
        for _, server in self._servers:
            await server.close(grace)
        for door in self._each_door():
            await door.close()
        self.closed.set()
        if self._writer is not None:
            self._send_figures()
            with contextlib.suppress(ConnectionError):
                await self._writer.drain()


def main(argv: list[str]) -> int:
    configure_logging(log_format=LogFormat.JSON)
    return asyncio.run(DoorProcess().run(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
