"""Every front door of the supervisor: its listening socket held here (:mod:`.sockets`), its
calls served by the door process (:mod:`.process`), which this keeps running.

The supervisor binds each door's socket (or takes the one systemd passed) before the engines
start and holds it until it exits, so a connection made while the door process is replaced
waits in the kernel's backlog: none is refused. The door process gets the sockets as inherited
descriptors, at a spawn on the main thread like an engine's (the exec shim,
``PR_SET_PDEATHSIG``: it dies with the supervisor), and dials the channel (:mod:`.channel`) on
the supervisor's private socket in the state dir. It is started before the engines and again
at once when it dies (after a backoff if it keeps dying), its exits counted and explained; a
killed door process costs only the calls on its connections. The supervisor relays no call's
bytes and holds no caller's connection: what crosses is each engine's state one way
(:class:`~.remote.RemoteSeat`, the runners' seats) and calls in flight, figures and answers the
other. A channel that breaks -- or that the supervisor drops because the door process stopped
reading it -- costs nothing: the door process serves on and dials again, and is told the whole
state anew.

Its figures are the door process's, kept here across its restarts (no counter goes down), with
the door process's own: ``cuzkd_door_process_up``, ``..._restarts_total``,
``..._exits_total{cause}``, ``..._resident_memory_bytes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from cuzkd.config.doors import DoorPlan
from cuzkd.config.schema import DoorConfig
from cuzkd.errors import ChannelClosed
from cuzkd.log.engineline import own_line
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.metrics.door_metrics import DoorFigures, DoorMetrics
from cuzkd.supervisor.core.backoff import Backoff
from cuzkd.supervisor.core.handover import Child, DoorHandover, SeatState
from cuzkd.supervisor.door.channel import (
    BACKLOG,
    VERSION,
    Answer,
    Ask,
    Broken,
    Close,
    DoorSetup,
    EngineState,
    Figures,
    Hello,
    Ready,
    ServerLimits,
    Setup,
    ToDoor,
    frame,
    read_from_door,
)
from cuzkd.supervisor.door.inherited import Inherited
from cuzkd.supervisor.door.remote import RemoteSeat
from cuzkd.supervisor.door.sockets import DoorSockets
from cuzkd.supervisor.engines.seat import DoorSeat
from cuzkd.supervisor.proc.adopted import AdoptedProcess
from cuzkd.supervisor.proc.children import SPAWN_ERRORS, ChildProcess, ChildTable
from cuzkd.supervisor.proc.output import OutputLog, log_lines
from cuzkd.supervisor.proc.spawn import exit_cause
from cuzkd.supervisor.tasks import TaskSet
from cuzkd.unixsock import bind_private_socket

log = structlog.get_logger("cuzkd.supervisor")

#: The least time the refusals of a closing door get to reach their callers, however little is
#: left of shutdown_grace: each is one small HTTP/2 frame, and without it the caller would see
#: its call cancelled rather than why.
REFUSALS_GRACE = 1.0
#: How long an answer of the door process (the control API's questions) may take.
ASK_TIMEOUT = 5.0
#: Longest the start waits for the first door process to serve (it imports in about 0.3 s);
#: past it cuzkd starts anyway and the door serves once its process does.
READY_WAIT = 10.0
#: Longest a scrape waits for the door process's counts (a door process that is busy with a
#: flood answers late; the scrape then shows counts up to a second old).
FIGURES_WAIT = 0.5
#: A door process that ran this long before it ended is started again at once; one that dies
#: sooner, after a backoff (a door process that cannot start must not be spawned flat out).
STEADY_AFTER = 10.0
#: The door process's command: this Python, this cuzkd.
DOOR_MODULE = "cuzkd.supervisor.door.process"
#: The channel's socket, in the state dir (beside the engines' private sockets).
DOOR_CHANNEL = "door-channel.sock"
#: How long a connection to the channel's socket may take to say hello.
HELLO_WAIT = 5.0
#: How long a new connection may take to send the HTTP/2 preface (grpc clients send it at
#: once; a silent connection must not hold a slot).
PREFACE_TIMEOUT = 10.0


def server_limits(door: DoorConfig) -> ServerLimits:
    """The door process's bounds, from ``[door]``."""
    return ServerLimits(
        max_connections=door.max_connections, max_streams=door.max_streams,
        max_header_list_bytes=int(door.max_metadata), request_bytes=int(door.request_memory),
        connection_request_bytes=int(door.connection_request_memory),
        reply_bytes=int(door.reply_memory), preface_timeout=PREFACE_TIMEOUT,
        idle_timeout=float(door.idle_timeout), memory_max=int(door.memory_max))


class Doors:
    """The doors' sockets, the door process and the engines' seats behind it."""

    def __init__(self, plans: Sequence[DoorPlan], clock: Callable[[], float],
                 limits: ServerLimits, *, children: ChildTable, channel: Path,
                 passed: Sequence[Inherited] = ()) -> None:
        """``limits``: the door process's bounds; ``children``: the table it is spawned
        through; ``channel``: where the channel's socket is bound (in the state dir);
        ``passed``: the sockets systemd passed (:func:`.inherited.take_passed_sockets`), each
        the socket of the door that listens there."""
        self._plans = tuple(plans)
        self._channel_path = channel
        self._channel_server: asyncio.Server | None = None
        self._clock = clock
        self._limits = limits
        self._children = children
        self._sockets = DoorSockets(plans, passed)
        self.seats = {engine: RemoteSeat(engine, self._send, clock)
                      for plan in plans for engine in plan.engines}
        #: the counts of every door process that ended, and the one serving now
        self._base = DoorMetrics()
        for plan in plans:
            self._base.opened(plan.name, plan.engines)
        self._current: dict[str, DoorFigures] = {}
        self._process: ChildProcess | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ready = False
        #: set at the first Ready: the start waits for it (at most READY_WAIT)
        self._first_ready = asyncio.Event()
        self._closing = False
        self._started_at = 0.0
        self.restarts = 0
        self.exits: Counter[str] = Counter()
        self._backoff = Backoff(0.1, 10.0, 2.0, STEADY_AFTER)
        self._tasks = TaskSet()
        self._asks: dict[int, asyncio.Future[Any]] = {}
        self._ask_ids = itertools.count(1)
        self._exited = asyncio.Event()
        self._limited = LimitedLog()

    @property
    def planned(self) -> bool:
        """Whether the config has any door (none: no door process either)."""
        return bool(self._plans)

    def seat(self, engine: str) -> DoorSeat | None:
        """``engine``'s seat behind its door (None: no door in front of it)."""
        return self.seats.get(engine)

    # -- start and close -------------------------------------------------------------------

    async def start(self) -> None:
        """Take or bind every door's socket, then start the door process and wait for it to
        serve; DoorAddressError naming the address when a door cannot listen."""
        if not self._plans:
            return
        await self._sockets.open()
        self._channel_server = await asyncio.start_unix_server(
            self._talk, sock=bind_private_socket(self._channel_path))
        self._spawn()
        with contextlib.suppress(TimeoutError):  # calls wait in the backlog until it serves
            await asyncio.wait_for(self._first_ready.wait(), READY_WAIT)

    async def adopt(self, handed: DoorHandover) -> None:
        """Carry on from the old code's :meth:`handover` (``cuzkd upgrade``; its seats taken
        by :meth:`adopt_seats` first): the same sockets,
        the channel's listener (the door process dials it again and is told the same state),
        the door process watched again, the counts of those that ended before."""
        self._sockets.adopt(handed.sockets)
        channel = socket.socket(fileno=handed.channel)
        channel.set_inheritable(False)
        self._channel_server = await asyncio.start_unix_server(self._talk, sock=channel)
        self._base.absorb(handed.ended, gauges=False)
        self.restarts, self.exits = handed.restarts, Counter(handed.exits)
        if handed.process is None:
            self._spawn()
            return
        proc = AdoptedProcess(handed.process.pid, handed.process.stdout, handed.process.stderr)
        self._children.adopt(proc, self._on_exit)
        self._watch(proc, self._clock() - handed.ran_for)
        self._ready = handed.ready

    def adopt_seats(self, handed: dict[str, SeatState]) -> None:
        """The engines' seats as the old code left them: before the runners adopt their
        processes (an admitted one's seat is its runner's again)."""
        for engine, seat in handed.items():
            if engine in self.seats:
                self.seats[engine].adopt(seat)

    def handover(self) -> DoorHandover | None:
        """The doors for the program that replaces the supervisor (None: no door)."""
        if self._channel_server is None:
            return None
        proc = self._process
        return DoorHandover(
            channel_version=VERSION, sockets=self._sockets.by_address(),
            channel=self._channel_server.sockets[0].fileno(),
            process=None if proc is None else Child(proc.pid, proc.stdout.fileno(),
                                                    proc.stderr.fileno()),
            ran_for=self._clock() - self._started_at, ready=self._ready,
            restarts=self.restarts, exits=dict(self.exits), ended=self._base.snapshot(),
            seats={engine: seat.handover() for engine, seat in self.seats.items()})

    async def close(self, grace: float) -> None:
        """cuzkd exits (the engines have stopped): the door process refuses what it still has
        (at least :data:`REFUSALS_GRACE` for that), ends, and the sockets go."""
        self._closing = True
        if self._process is not None:
            self._send(Close(max(grace, REFUSALS_GRACE)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exited.wait(), max(grace, REFUSALS_GRACE) + 2.0)
            if self._process is not None:
                self._process.signal_group(signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._exited.wait(), 5.0)
        await self._tasks.cancel_all()
        if self._channel_server is not None:
            self._channel_server.close()
            with contextlib.suppress(OSError):
                self._channel_path.unlink()
        self._sockets.close()

    # -- the door process ------------------------------------------------------------------

    def _spawn(self) -> None:
        """Start the door process with the doors' sockets; it dials the channel."""
        if self._closing:
            return
        fds = self._sockets.filenos()
        try:
            proc = self._children.spawn(
                [sys.executable, "-m", DOOR_MODULE, os.fspath(self._channel_path)],
                dict(os.environ), self._on_exit, pass_fds=fds)
        except SPAWN_ERRORS as exc:
            self._limited.log(log, "error", "door_process_spawn_failed", key=type(exc).__name__,
                              error=str(exc))
            self._restart_later()
            return
        log.info("door_process_spawned", pid=proc.pid)
        self._watch(proc, self._clock())

    def _watch(self, proc: ChildProcess, started_at: float) -> None:
        """The door process serves (spawned, or adopted): its output read under
        ``cuzkd.door``."""
        self._process, self._started_at = proc, started_at
        self._exited = asyncio.Event()
        notes = OutputLog(lines=structlog.get_logger("cuzkd.door"), notes=log, record=own_line)
        self._tasks.start(log_lines(proc.stderr, notes, "stderr", proc.pid))
        self._tasks.start(log_lines(proc.stdout, notes, "stdout", proc.pid))

    def _setup_of(self, plan: DoorPlan) -> DoorSetup:
        """The plan as plain numbers: the configuration's sizes and durations are int and float
        subclasses the channel's encoder does not take."""
        return DoorSetup(
            address=plan.address, engines=plan.engines, fd=self._sockets.fileno(plan.address),
            hold_timeout=float(plan.hold_timeout), hold_max_calls=int(plan.hold_max_calls),
            hold_max_bytes=int(plan.hold_max_bytes), retry_max_bytes=int(plan.retry_max_bytes),
            deadlines={k: float(v) for k, v in plan.deadlines.items()},
            allowances={k: float(v) for k, v in plan.allowances.items()},
            quarantine=float(plan.quarantine), one_post=tuple(sorted(plan.one_post)),
            max_message_bytes=int(plan.max_message_bytes))

    async def _talk(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection to the channel's socket: the door process this supervisor runs says
        hello, is told its setup and the engines' state, then tells until the channel ends
        (it dials again if it lives on). Anything else that dials is told to close."""
        try:
            hello = await asyncio.wait_for(read_from_door(reader), HELLO_WAIT)
            if not isinstance(hello, Hello) or hello.version != VERSION:
                raise ChannelClosed(f"the door process speaks {hello!r}, not version {VERSION}")
            if self._process is None or hello.pid != self._process.pid:
                writer.write(frame(Close(0.0)))
                raise ChannelClosed(f"pid {hello.pid} is not this supervisor's door process")
            if self._writer is not None:  # an older connection of the same process
                self._writer.close()
            writer.write(frame(Hello(VERSION, os.getpid())))
            writer.write(frame(Setup([self._setup_of(plan) for plan in self._plans],
                                     self._limits)))
            for seat in self.seats.values():
                for message in seat.replay():
                    writer.write(frame(message))
            self._writer = writer
            while True:
                self._heard(await read_from_door(reader))
        except (ChannelClosed, TimeoutError) as exc:
            if not self._closing:
                self._limited.log(log, "warning", "door_channel_closed", key="closed",
                                  error=str(exc) or "no hello in time")
        finally:
            if self._writer is writer:
                self._channel_lost()
            writer.close()

    def _channel_lost(self) -> None:
        """The channel ended: questions in flight fail (the door process dials again, and its
        in-flight counts stand meanwhile: it still has those calls)."""
        self._writer = None
        for future in self._asks.values():
            if not future.done():
                future.set_exception(ChannelClosed("the channel to the door process closed"))
        self._asks.clear()

    def _heard(self, message: object) -> None:
        match message:
            case EngineState(engine=engine):
                if (seat := self.seats.get(engine)) is not None:
                    seat.told(message)
            case Broken(engine=engine):
                if (seat := self.seats.get(engine)) is not None:
                    seat.broke(message)
            case Figures(doors=doors):
                self._current = doors
            case Answer(id=ask_id, body=body):
                if (future := self._asks.pop(ask_id, None)) is not None and not future.done():
                    future.set_result(body)
            case Ready():
                if not self._ready:
                    log.info("door_process_serving",
                             pid=self._process.pid if self._process else None)
                self._ready = True
                self._first_ready.set()
            case _:
                raise ChannelClosed(f"unexpected {type(message).__name__}")

    def _send(self, message: ToDoor) -> None:
        """To the door process; dropped while the channel is down (it is told the whole state
        when it dials again). A door process that has stopped reading (frozen, or stuck) loses
        its channel past :data:`~.channel.BACKLOG` unsent, rather than the supervisor's
        memory."""
        writer = self._writer
        if writer is None or writer.is_closing():
            return
        if writer.transport.get_write_buffer_size() > BACKLOG:
            self._limited.log(log, "warning", "door_channel_closed", key="backlog",
                              error=f"over {BACKLOG} bytes unsent: the door process is not "
                                    "reading; it is told the whole state when it dials again")
            writer.transport.abort()  # a close would wait to send what it cannot
            self._channel_lost()
            return
        writer.write(frame(message))

    def _on_exit(self, wait_status: int) -> None:
        proc = self._process
        cause, _ = exit_cause(wait_status)
        self._process, self._ready = None, False
        if self._writer is not None:
            self._writer.close()
            self._channel_lost()
        self._exited.set()
        self.exits[cause] += 1
        self._base.absorb(self._current, gauges=False)
        self._current = {}
        for seat in self.seats.values():
            seat.door_lost()
        if self._closing:
            log.info("door_process_exited", pid=proc.pid if proc else None, cause=cause)
            return
        log.warning("door_process_exited", pid=proc.pid if proc else None, cause=cause,
                    detail="the calls on its connections failed; a new one takes the "
                           "sockets at once")
        self.restarts += 1
        self._restart_later()

    def _restart_later(self) -> None:
        ran = self._clock() - self._started_at
        delay = self._backoff.next_delay(ran)
        asyncio.get_running_loop().call_later(delay, self._spawn)

    # -- what the control API and the scrape read ------------------------------------------

    async def ask(self, what: str, request_id: str = "") -> Any:
        """A question for the door process (``doors``, ``release``); ChannelClosed when none
        answers."""
        if self._writer is None:
            raise ChannelClosed("no door process serves now (it is being started again)")
        ask_id = next(self._ask_ids)
        future = self._asks[ask_id] = asyncio.get_running_loop().create_future()
        self._send(Ask(ask_id, what, request_id))
        try:
            return await asyncio.wait_for(future, ASK_TIMEOUT)
        except TimeoutError:
            raise ChannelClosed(f"the door process did not answer within {ASK_TIMEOUT:g} s")\
                from None
        finally:
            self._asks.pop(ask_id, None)

    async def refresh_figures(self) -> None:
        """The door process's counts as they are now (it sends them every
        :data:`~cuzkd.supervisor.door.process.FIGURES_EVERY` too): a scrape waits for them at
        most :data:`FIGURES_WAIT`, then renders the last ones it has."""
        if self._writer is None:
            return
        with contextlib.suppress(ChannelClosed, TimeoutError):
            await asyncio.wait_for(self.ask("figures"), FIGURES_WAIT)

    def process_info(self) -> dict[str, Any]:
        """The door process for ``cuzkd status``: pid, memory, restarts, exits, bounds hit."""
        proc = self._process
        bounds: Counter[str] = Counter()
        for figures in (self._base.snapshot(), self._current):
            for door in figures.values():
                bounds.update(door.bounds)
        return {"pid": proc.pid if proc is not None else None, "ready": self._ready,
                "started_at": (time.time() - (self._clock() - self._started_at)
                               if proc is not None else None),
                "resident_memory_bytes": _rss(proc.pid) if proc is not None else None,
                "restarts": self.restarts, "exits": dict(self.exits),
                "bounds_hit": {k: v for k, v in sorted(bounds.items()) if v}}

    def collect(self) -> Iterator[Metric]:
        """The doors' families (every door process's counts), and the door process's own."""
        if not self._plans:
            return
        merged = DoorMetrics()
        merged.absorb(self._base.snapshot(), gauges=False)
        merged.absorb(self._current, gauges=True)
        yield from merged.collect()
        up = GaugeMetricFamily("cuzkd_door_process_up",
                               "1 while the door process serves every door, else 0.")
        up.add_metric([], 1.0 if self._ready else 0.0)
        restarts = CounterMetricFamily(
            "cuzkd_door_process_restarts",
            "Times the door process was started again after it ended (its calls failed).")
        restarts.add_metric([], self.restarts)
        exits = CounterMetricFamily("cuzkd_door_process_exits",
                                    "Door process exits, by cause (exit_N, signal_NAME).",
                                    labels=["cause"])
        for cause, n in sorted(self.exits.items()):
            exits.add_metric([cause], n)
        yield from (up, restarts)
        if self.exits:  # a family without a series would have no `cause` label
            yield exits
        if self._process is not None and (rss := _rss(self._process.pid)) is not None:
            memory = GaugeMetricFamily("cuzkd_door_process_resident_memory_bytes",
                                       "The door process's resident memory.")
            memory.add_metric([], rss)
            yield memory


def _rss(pid: int) -> int | None:
    """The resident memory of ``pid`` (None when it is gone)."""
    try:
        pages = Path(f"/proc/{pid}/statm").read_text().split()[1]
    except (OSError, IndexError):
        return None
    return int(pages) * os.sysconf("SC_PAGE_SIZE")
