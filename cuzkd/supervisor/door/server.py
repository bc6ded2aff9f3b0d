"""The door process's gRPC server: unary calls over cleartext HTTP/2 with prior knowledge, on the
``h2`` library, as grpc-go and grpc's C core dial ``unix://`` and ``host:port`` insecure.

grpcio's server lets Python set no resource quota and cannot tell connections apart in a
handler, so it cannot hold a caller to its share; this one holds each bound where the bytes
arrive, counts it by name when hit (:data:`BOUNDS`) and never costs a call already admitted.
The bounds are :class:`ServerBounds`; what each lets a caller take is docs/door.md, *The door's
own process, and what a caller may take of it*, and why the server is built this way is the
*The server* item of *The shell around the book* there.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import resource
import socket
import struct
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame
import structlog

from cuzkd.errors import GrpcError
from cuzkd.log.ratelimit import LimitedLog

log = structlog.get_logger("cuzkd.door")

#: The bounds' names, as counted (``cuzkd_door_bounds_hit_total{bound}``).
BOUNDS = ("connections", "streams", "header_list", "message_size", "request_bytes",
          "request_stall", "reply_bytes", "preface_timeout", "idle", "rapid_reset",
          "reply_stall", "frame_size")
_PREFIX = struct.Struct("!BI")
_RST_STREAM = 0x3  # the frame type
_TIMEOUT = re.compile(rb"^(\d{1,8})([HMSmun])$")
#: Bytes a caller may send ahead of our acknowledgement on a call: a 51 MB request crosses in
#: ~50 round trips, not ~800 of HTTP/2's 64 KiB.
WINDOW = 1 << 20
#: How long a connection being closed may take to send what it was last told.
CLOSE_WAIT = 1.0
_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


class CallContext(Protocol):
    """What a handler may ask of its call."""

    def time_remaining(self) -> float | None:
        """Seconds left of the caller's ``grpc-timeout`` (None: it set none)."""
        ...


#: A call's handler: (its path, its request message's bytes, its context) -> the reply's bytes.
Handler = Callable[[str, bytes, CallContext], Awaitable[bytes]]


@dataclass(frozen=True)
class ServerBounds:
    """What a caller may take (docs/door.md's bounds table); the defaults are far above
    anything an honest Curio does. An idle connection's GOAWAY says ``NO_ERROR``, so the
    caller's next call opens another."""

    max_connections: int = 512
    max_streams: int = 128
    max_header_list_bytes: int = 16 << 10
    max_message_bytes: int = 128 << 20
    request_bytes: int = 1 << 30
    connection_request_bytes: int = 256 << 20
    #: bytes received for calls held by the request budgets, in all (each may have sent its
    #: window, 1 MiB, before it knew): past it, held calls are refused, the newest of the
    #: connection that holds the most first
    held_request_bytes: int = 64 << 20
    reply_bytes: int = 1 << 30
    preface_timeout: float = 10.0
    idle_timeout: float = 300.0
    reply_stall_timeout: float = 60.0
    #: a request being received must move this fast (bytes/s, while its window is open)
    #: over this long, or it is reset
    min_request_rate: int = 16 << 10
    request_stall_timeout: float = 10.0
    #: stream resets a client may send per second (over a one-second window) on a connection
    resets_per_second: int = 200
    read_chunk: int = 64 << 10
    #: descriptors kept free of connections (the door's engines' channels, its log)
    fd_reserve: int = 64


def connection_limit(bounds: ServerBounds) -> int:
    """The connections a server takes at once: its bound, within the descriptors this process
    may open less its reserve (the soft limit raised to the hard one first)."""
    with contextlib.suppress(OSError, ValueError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return max(1, min(bounds.max_connections, soft - bounds.fd_reserve))


def percent_encoded(message: str) -> str:
    """``grpc-message`` as gRPC spells it: UTF-8, every byte outside printable ASCII and
    ``%`` itself as ``%XX``."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}"
                   for b in message.encode())


def parse_timeout(value: bytes) -> float | None:
    """``grpc-timeout`` in seconds (None when absent or not gRPC's spelling)."""
    match = _TIMEOUT.match(value)
    return None if match is None else int(match.group(1)) * _UNITS[match.group(2)]


class _Budget:
    """Bytes taken of a shared bound, and who waits for some to be given back."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.waiting: deque[_Connection] = deque()
        #: the one request acknowledged while the budget is spent (the first held connection's
        #: oldest): it finishes and gives its bytes back, or stalls and is reset
        self.passing: _Stream | None = None
        #: bytes received and not acknowledged for the calls held
        self.held = 0

    def fits(self, n: int) -> bool:
        return self.used + n <= self.limit


@dataclass
class _Stream:
    """One call on a connection."""

    id: int
    path: str
    deadline: float | None
    received: bytearray = field(default_factory=bytearray)
    #: bytes received but not yet acknowledged (held by flow control)
    unacked: int = 0
    #: its acknowledgement withheld by the request budgets
    held: bool = False
    ended: bool = False
    task: asyncio.Task[None] | None = None
    #: the reply's bytes not yet sent, and when any last moved
    outbox: memoryview | None = None
    trailers: list[tuple[str, str]] | None = None
    moved: float = 0.0
    #: while its request is received: when, and at how many bytes, its progress was last
    #: checked
    mark: tuple[float, int] = (0.0, 0)


class _Context:
    def __init__(self, deadline: float | None) -> None:
        self._deadline = deadline

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - asyncio.get_running_loop().time())


class _FrameHeaders:
    """Walks the frame headers of what a connection sends (after the client's 24-byte
    preface), so that a frame longer than HTTP/2 lets it send is refused on its 9-byte
    header -- h2 buffers a frame whole, up to 16 MiB its header may claim, before it looks
    at the length -- and the streams a client resets are counted before h2 parses them (a
    64 KiB read holds ~2,000 streams opened and reset, each a cost in h2). The walk steps
    frame by frame, never byte by byte."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._preface = len(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # the client's first bytes
        self._header = bytearray()
        self._left = 0
        #: RST_STREAM frames walked since the last :meth:`take_resets`
        self._resets = 0

    def take_resets(self) -> int:
        resets, self._resets = self._resets, 0
        return resets

    def overlong(self, data: bytes) -> int | None:
        """The length a frame header in ``data`` claims over the limit (None: none does)."""
        i, n = 0, len(data)
        if self._preface:
            i = min(self._preface, n)
            self._preface -= i
        while i < n:
            if self._left:
                step = min(self._left, n - i)
                self._left -= step
                i += step
                continue
            take = min(9 - len(self._header), n - i)
            self._header += data[i:i + take]
            i += take
            if len(self._header) == 9:
                length = int.from_bytes(self._header[:3], "big")
                if self._header[3] == _RST_STREAM:
                    self._resets += 1
                self._header.clear()
                if length > self._limit:
                    return length
                self._left = length
        return None


class GrpcServer:
    """Serves ``handler`` on the listening sockets it is given (:meth:`serve`)."""

    def __init__(self, handler: Handler, bounds: ServerBounds = ServerBounds(), *,
                 on_bound: Callable[[str], None] = lambda bound: None) -> None:
        """``on_bound``: told the name of a bound each time one is held against a caller."""
        self.handler = handler
        self.bounds = bounds
        self._on_bound = on_bound
        self.bounds_hit: Counter[str] = Counter()
        self._limit = connection_limit(bounds)
        self._connections: set[_Connection] = set()
        self._slot = asyncio.Event()
        self.request_budget = _Budget(bounds.request_bytes)
        self.reply_budget = _Budget(bounds.reply_bytes)
        self._accepting: list[asyncio.Task[None]] = []
        self._limited = LimitedLog()
        self._stall_watch: asyncio.Task[None] | None = None

    @property
    def connections(self) -> int:
        return len(self._connections)

    @property
    def open_streams(self) -> int:
        return sum(len(c.streams) for c in self._connections)

    def hit(self, bound: str, **fields: Any) -> None:
        """A bound was held against a caller: counted, told, logged (once per 10 s each)."""
        self.bounds_hit[bound] += 1
        self._on_bound(bound)
        self._limited.log(log, "warning", "door_bound_reached", key=bound, bound=bound, **fields)

    async def serve(self, sock: socket.socket) -> None:
        """Accept connections on the listening ``sock`` from now on."""
        sock.setblocking(False)
        self._accepting.append(asyncio.get_running_loop().create_task(self._accept(sock)))
        if self._stall_watch is None:
            self._stall_watch = asyncio.get_running_loop().create_task(self._watch_stalls())

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while len(self._connections) >= self._limit:
                if not self._evict_idlest():
                    self._slot.clear()
                    await self._slot.wait()
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:  # EMFILE and the like: the backlog keeps the caller
                self._limited.log(log, "warning", "door_accept_failed", key=exc.errno,
                                  error=str(exc))
                await asyncio.sleep(0.1)
                continue
            with contextlib.suppress(OSError):
                await loop.connect_accepted_socket(lambda: _Connection(self), conn)

    def _evict_idlest(self) -> bool:
        """Make room at the connection bound: GOAWAY to the connection idle longest."""
        idle = [c for c in self._connections if not c.streams and not c.going_away]
        if not idle:
            return False
        self.hit("connections", connections=len(self._connections))
        min(idle, key=lambda c: c.idle_since).go_away(h2.errors.ErrorCodes.NO_ERROR)
        return True

    def added(self, conn: _Connection) -> None:
        self._connections.add(conn)

    def removed(self, conn: _Connection) -> None:
        self._connections.discard(conn)
        self._slot.set()

    def refuse_held(self) -> None:
        """Past the bytes kept for held calls: refuse held calls, the newest of the connection
        that holds the most first, until what is kept fits (an honest Curio's held calls keep
        a few MiB; a flood of them is the flooder's to lose)."""
        budget = self.request_budget
        while budget.held > self.bounds.held_request_bytes:
            conn = max(self._connections, key=lambda c: c.held_bytes())
            newest = next((s for s in reversed(conn.streams.values()) if s.held), None)
            if newest is None:  # nothing held to refuse
                return
            self.hit("request_bytes", held=budget.held)
            conn.reset(newest.id, h2.errors.ErrorCodes.REFUSED_STREAM)

    def resume_held(self) -> None:
        """Request bytes were given back: each connection the budgets held acknowledges what
        fits now (one still past a budget waits again)."""
        budget = self.request_budget
        held, budget.waiting = list(budget.waiting), deque()
        for conn in held:
            conn.resume_acks()

    async def _watch_stalls(self) -> None:
        """Once a second: requests their senders stopped sending and replies their callers do
        not read are reset (while unread replies exceed their budget, the stalest first)."""
        while True:
            await asyncio.sleep(1.0)
            now = asyncio.get_running_loop().time()
            for conn in list(self._connections):
                conn.check_requests(now)
            stalled = sorted(((s.moved, c, s) for c in self._connections
                              for s in c.streams.values() if s.outbox is not None),
                             key=lambda item: item[0])
            for moved, conn, stream in stalled:
                if now - moved >= self.bounds.reply_stall_timeout:
                    self.hit("reply_stall")
                elif self.reply_budget.used > self.reply_budget.limit:
                    self.hit("reply_bytes", pending=self.reply_budget.used)
                else:
                    break
                conn.reset(stream.id, h2.errors.ErrorCodes.CANCEL)

    def goaway(self) -> None:
        """Accept nothing more; every connection is told GOAWAY (its calls go on)."""
        for task in self._accepting:
            task.cancel()
        self._accepting.clear()
        for conn in list(self._connections):
            conn.go_away(h2.errors.ErrorCodes.NO_ERROR)

    async def close(self, grace: float) -> None:
        """GOAWAY, then the calls in flight get ``grace`` seconds to be answered and their
        connections to close (each closes once its last answer is written); then the rest are
        cut."""
        self.goaway()
        loop = asyncio.get_running_loop()
        until = loop.time() + grace
        while self._connections and (left := until - loop.time()) > 0:
            self._slot.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._slot.wait(), left)
        for conn in list(self._connections):
            conn.abort()
        if self._stall_watch is not None:
            self._stall_watch.cancel()


class _Connection(asyncio.BufferedProtocol):
    """One client connection: its h2 state machine, its calls, its share of the budgets.

    Its methods are h2's events and the bounds each one is checked against; they share the
    connection's state, so they stay in one class."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.bounds = server.bounds
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding=None, validate_inbound_headers=True))
        self.streams: dict[int, _Stream] = {}
        self._buffer = bytearray(self.bounds.read_chunk)
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self.idle_since = self._loop.time()
        self.going_away = False
        self._preface_seen = False
        self._frames = _FrameHeaders(h2.settings.Settings().max_frame_size)
        self._paused = False
        self._received_bytes = 0  # request bytes held by this connection's calls
        self._held_back = False  # its senders wait for the budgets (counted once a time)
        #: (when, how many) of the client's stream resets over the last second, and their sum
        self._resets: deque[tuple[float, int]] = deque()
        self._reset_count = 0
        self._last_stream = 0
        self._timer: asyncio.TimerHandle | None = None
        self._closing: asyncio.TimerHandle | None = None

    # -- asyncio ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self.server.added(self)
        settings = h2.settings.SettingCodes
        self.h2.local_settings = h2.settings.Settings(client=False, initial_values={
            settings.MAX_CONCURRENT_STREAMS: self.bounds.max_streams,
            settings.MAX_HEADER_LIST_SIZE: self.bounds.max_header_list_bytes,
            settings.INITIAL_WINDOW_SIZE: WINDOW,
        })
        self.h2.initiate_connection()
        # room for the held calls' bytes (which keep their share of this window) and, beside
        # them, for the one let through, with half the window not yet given back by h2
        self.h2.increment_flow_control_window(
            2 * (self.bounds.held_request_bytes + 2 * WINDOW)
            - h2.settings.Settings().initial_window_size)
        self._flush()
        self._timer = self._loop.call_later(self.bounds.preface_timeout, self._preface_late)

    def get_buffer(self, sizehint: int) -> bytearray:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(self._buffer[:nbytes])
        if (length := self._frames.overlong(data)) is not None:
            self.server.hit("frame_size", length=length)
            self.abort()
            return
        if (resets := self._frames.take_resets()) and self._resetting_flat_out(resets):
            return
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:  # h2 has queued its GOAWAY
            if isinstance(exc, h2.exceptions.TooManyStreamsError):  # past the bound it was told
                self.server.hit("streams", open=len(self.streams))
            self._flush()
            self._close_broken(f"HTTP/2 protocol error: {exc}")
            return
        for event in events:
            self._event(event)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        with contextlib.suppress(ValueError):
            self.server.request_budget.waiting.remove(self)
        for stream in list(self.streams.values()):
            self._drop(stream)
        for timer in (self._timer, self._closing):
            if timer is not None:
                timer.cancel()
        self.server.removed(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._send_pending()
        self._flush()

    # -- h2's events -----------------------------------------------------------------------

    def _event(self, event: h2.events.Event) -> None:
        if not self._preface_seen and isinstance(event, h2.events.RemoteSettingsChanged):
            self._preface_seen = True
            self._rearm_idle()
        match event:
            case h2.events.RequestReceived():
                self._request(event)
            case h2.events.DataReceived():
                self._data(event)
            case h2.events.StreamEnded() if (stream := self.streams.get(event.stream_id)):
                self._ended(stream)
            case h2.events.StreamReset():
                self._reset_by_client(event.stream_id)
            case h2.events.WindowUpdated():
                self._send_pending()
            case h2.events.ConnectionTerminated():
                self.going_away = True
                if not self.streams:
                    self.abort()

    def _request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        self._last_stream = max(self._last_stream, stream_id)
        headers = dict(event.headers or [])
        if self.going_away:  # after our GOAWAY: the caller opens it on a new connection
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        if len(self.streams) >= self.bounds.max_streams:
            self.server.hit("streams", open=len(self.streams))
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        size = sum(len(k) + len(v) + 32 for k, v in (event.headers or []))
        if size > self.bounds.max_header_list_bytes:
            self.server.hit("header_list", size=size)
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        if headers.get(b":method") != b"POST" or not headers.get(
                b"content-type", b"").startswith(b"application/grpc"):
            self.h2.send_headers(stream_id, [(":status", "415")], end_stream=True)
            return
        timeout = parse_timeout(headers.get(b"grpc-timeout", b""))
        deadline = None if timeout is None else self._loop.time() + timeout
        path = headers.get(b":path", b"").decode(errors="replace")
        self.streams[stream_id] = _Stream(stream_id, path, deadline,
                                          mark=(self._loop.time(), 0))
        if self._timer is not None:  # a call is open: not idle
            self._timer.cancel()
            self._timer = None

    def _data(self, event: h2.events.DataReceived) -> None:
        stream = self.streams.get(event.stream_id)
        if stream is None:  # refused or ended already: give the window back
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            return
        stream.received += event.data
        self._take(len(event.data))
        if len(stream.received) >= _PREFIX.size:
            compressed, length = _PREFIX.unpack_from(stream.received)
            if length > self.bounds.max_message_bytes:
                self.server.hit("message_size", length=length)
                self._fail(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"Received message larger than max ({length} vs. "
                           f"{self.bounds.max_message_bytes})")
                return
            if compressed:
                self._fail(stream, grpc.StatusCode.UNIMPLEMENTED,
                           "compressed messages are not supported by cuzkd's door")
                return
        stream.unacked += event.flow_controlled_length
        if stream.held:
            self.server.request_budget.held += event.flow_controlled_length
        self._acknowledge(stream)
        if self.server.request_budget.held > self.bounds.held_request_bytes:
            self.server.refuse_held()

    def _take(self, n: int) -> None:
        self._received_bytes += n
        self.server.request_budget.used += n

    def _release(self, stream: _Stream) -> None:
        """A request is no longer being received (complete, or its call gone): its bytes are
        given back, and the calls the budgets held may move."""
        budget = self.server.request_budget
        if budget.passing is stream:
            budget.passing = None
        held, stream.received = len(stream.received), bytearray()
        self._received_bytes -= held
        budget.used -= held
        self.server.resume_held()

    def held_bytes(self) -> int:
        return sum(stream.unacked for stream in self.streams.values() if stream.held)

    def _unhold(self, stream: _Stream) -> None:
        """What the request's sender sent is acknowledged (the budgets let it move, or the
        request needs no more of it: complete, or its call gone), held or not."""
        if stream.held:
            stream.held = False
            self.server.request_budget.held -= stream.unacked
        if stream.unacked:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.acknowledge_received_data(stream.unacked, stream.id)
            stream.unacked = 0

    def _within_budgets(self) -> bool:
        return (self._received_bytes <= self.bounds.connection_request_bytes
                and self.server.request_budget.fits(0))

    def _passes(self, stream: _Stream) -> bool:
        """Past a budget, whether ``stream`` is still acknowledged: the connection's oldest
        request is, and past the total budget only the one :attr:`_Budget.passing`."""
        if stream is not next((s for s in self.streams.values() if not s.ended), None):
            return False
        budget = self.server.request_budget
        if budget.fits(0):
            return True
        if budget.passing is None:
            budget.passing = stream
        return budget.passing is stream

    def _acknowledge(self, stream: _Stream) -> None:
        """Give the sender its window back while the budgets allow (or ``stream`` passes);
        else it waits, counted once a time its connection is held."""
        budget = self.server.request_budget
        if self._within_budgets() or self._passes(stream):
            if stream.held:  # its sender may move again from now: its stall clock starts
                stream.mark = (self._loop.time(), len(stream.received))
            self._unhold(stream)
            return
        if not stream.held:
            stream.held = True
            budget.held += stream.unacked
        if not self._held_back:
            self._held_back = True
            self.server.hit("request_bytes", connection=self._received_bytes,
                            total=budget.used)
        if self not in budget.waiting:
            budget.waiting.append(self)

    def check_requests(self, now: float) -> None:
        """Reset the requests whose senders, their windows open, stopped sending."""
        bounds = self.bounds
        for stream in list(self.streams.values()):
            if stream.ended or stream.unacked:  # complete, or held back by us
                stream.mark = (now, len(stream.received))
                continue
            since, size = stream.mark
            if now - since < bounds.request_stall_timeout:
                continue
            if len(stream.received) - size < bounds.min_request_rate * (now - since):
                self.server.hit("request_stall", received=len(stream.received))
                self.reset(stream.id, h2.errors.ErrorCodes.CANCEL)
            else:
                stream.mark = (now, len(stream.received))

    def resume_acks(self) -> None:
        for stream in list(self.streams.values()):
            if stream.unacked:
                self._acknowledge(stream)
        if self._within_budgets():
            self._held_back = False
        self._flush()

    def _ended(self, stream: _Stream) -> None:
        if stream.ended or stream.task is not None:
            return
        stream.ended = True
        data = bytes(stream.received)
        self._unhold(stream)
        self._release(stream)
        if len(data) < _PREFIX.size or len(data) != _PREFIX.size + _PREFIX.unpack_from(data)[1]:
            self._fail(stream, grpc.StatusCode.INTERNAL,
                       "a unary call's request must be exactly one whole message")
            return
        stream.task = self._loop.create_task(self._run(stream, data[_PREFIX.size:]))

    async def _run(self, stream: _Stream, request: bytes) -> None:
        timeout = None if stream.deadline is None else stream.deadline - self._loop.time()
        call = self.server.handler(stream.path, request, _Context(stream.deadline))
        try:
            reply = await asyncio.wait_for(call, timeout)
        except GrpcError as exc:
            self._fail(stream, exc.code, exc.message)
        except TimeoutError:
            self._fail(stream, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the handler's bug: the caller is told, the door serves on
            log.error("door_handler_failed", path=stream.path, error=repr(exc), exc_info=exc)
            self._fail(stream, grpc.StatusCode.INTERNAL, "cuzkd's door failed the call")
        else:
            self._reply(stream, reply)
        finally:
            self._flush()

    def _reset_by_client(self, stream_id: int) -> None:
        if (stream := self.streams.get(stream_id)) is not None:
            self._drop(stream)

    def _resetting_flat_out(self, resets: int) -> bool:
        """Count ``resets`` more of the client's stream resets: past the bound (over a
        second) it gets GOAWAY ``ENHANCE_YOUR_CALM`` and is closed, what it sent unparsed."""
        now = self._loop.time()
        self._resets.append((now, resets))
        self._reset_count += resets
        while now - self._resets[0][0] > 1.0:
            self._reset_count -= self._resets.popleft()[1]
        if self._reset_count <= self.bounds.resets_per_second:
            return False
        self.server.hit("rapid_reset", resets=self._reset_count)
        self.go_away(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        self._close()
        return True

    # -- answers ---------------------------------------------------------------------------

    def _reply(self, stream: _Stream, reply: bytes) -> None:
        if stream.id not in self.streams:
            return
        self.h2.send_headers(stream.id, [(":status", "200"),
                                         ("content-type", "application/grpc")])
        stream.outbox = memoryview(_PREFIX.pack(0, len(reply)) + reply)
        stream.trailers = [("grpc-status", "0")]
        stream.moved = self._loop.time()
        self.server.reply_budget.used += len(stream.outbox)
        self._send_pending()

    def _fail(self, stream: _Stream, code: grpc.StatusCode, message: str) -> None:
        """End the call with a gRPC error (Trailers-Only), its request dropped."""
        if stream.id not in self.streams:
            return
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.send_headers(stream.id, [
                (":status", "200"), ("content-type", "application/grpc"),
                ("grpc-status", str(code.value[0])),
                ("grpc-message", percent_encoded(message))], end_stream=True)
        self._drop(stream, cancel=False)

    def _send_pending(self) -> None:
        """Send what the callers' windows and the transport allow of the replies."""
        for stream in list(self.streams.values()):
            if self._paused:
                return
            if stream.outbox is None:
                continue
            while stream.outbox:
                window = min(self.h2.local_flow_control_window(stream.id),
                             self.h2.max_outbound_frame_size)
                if window <= 0:
                    break
                chunk = stream.outbox[:window]
                self.h2.send_data(stream.id, bytes(chunk))
                stream.outbox = stream.outbox[len(chunk):]
                self.server.reply_budget.used -= len(chunk)
                stream.moved = self._loop.time()
            if not stream.outbox:
                self.h2.send_headers(stream.id, stream.trailers or [], end_stream=True)
                stream.outbox = None
                self._drop(stream, cancel=False)

    def reset(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        """End a call from this side (its reply not read, the connection going)."""
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.reset_stream(stream_id, code)
        if (stream := self.streams.get(stream_id)) is not None:
            self._drop(stream)
        self._flush()

    def _drop(self, stream: _Stream, *, cancel: bool = True) -> None:
        """Forget a call: its handler cancelled (unless it ended it), its bytes given back."""
        self.streams.pop(stream.id, None)
        if cancel and stream.task is not None and not stream.task.done():
            stream.task.cancel()
        self._unhold(stream)
        if not stream.ended:
            self._release(stream)
        if stream.outbox is not None:
            self.server.reply_budget.used -= len(stream.outbox)
            stream.outbox = None
        if not self.streams:
            if self.going_away:
                self._close_soon(0.0)
            else:
                self._rearm_idle()

    # -- the connection's end --------------------------------------------------------------

    def _rearm_idle(self) -> None:
        self.idle_since = self._loop.time()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(self.bounds.idle_timeout, self._idle)

    def _idle(self) -> None:
        self._timer = None
        if not self.streams:
            self.server.hit("idle")
            self.go_away(h2.errors.ErrorCodes.NO_ERROR)

    def _preface_late(self) -> None:
        self._timer = None
        if not self._preface_seen:
            self.server.hit("preface_timeout")
            self.abort()

    def go_away(self, code: h2.errors.ErrorCodes) -> None:
        """GOAWAY: no new call on this connection; it closes once its calls ended (at cuzkd's
        exit, :meth:`GrpcServer.close` ends those still open after its grace)."""
        if self.going_away:
            return
        self.going_away = True
        self._flush()
        if self._transport is not None and not self._transport.is_closing():
            # written by hand: h2's close_connection ends its state machine, and the calls
            # still open could then never be answered
            goaway = hyperframe.frame.GoAwayFrame(0)
            goaway.last_stream_id, goaway.error_code = self._last_stream, code
            self._transport.write(goaway.serialize())
        if not self.streams:
            self._close_soon(0.0)

    def _close_soon(self, delay: float) -> None:
        if self._closing is None:
            self._closing = self._loop.call_later(delay, self._close)

    def _close(self) -> None:
        """Close once what was written (a GOAWAY saying why) is sent -- or after
        :data:`CLOSE_WAIT` all the same: a caller that reads nothing does not keep it."""
        if self._transport is not None:
            self._transport.close()
            self._loop.call_later(CLOSE_WAIT, self._transport.abort)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _close_broken(self, why: str) -> None:
        log.debug("door_connection_closed", error=why)
        self._close_soon(0.0)

    def _flush(self) -> None:
        if (self._transport is not None and not self._transport.is_closing()
                and (data := self.h2.data_to_send())):
            self._transport.write(data)
