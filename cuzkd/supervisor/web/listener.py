"""The metrics listener: a bounded number of connections, idle ones closed.

Every connection to ``/metrics`` holds a descriptor, and 100 idle ones under ``ulimit -n 64``
once took every descriptor the supervisor had. :class:`GatedListener` therefore accepts by
itself, only while fewer than ``limit()`` connections are open, and closes a connection on which
no byte moved for ``idle`` seconds, by :mod:`~cuzkd.supervisor.core.idlewatch`'s rule. The HTTP
side is aiohttp's, each accepted socket handed to ``loop.connect_accepted_socket``; with TLS each
connection gets the context ``tls()`` returns then, so a rotated certificate serves the next
one. The limits are docs/supervisor.md, *Descriptors and repeated errors* and *Slow readers:
bounded responses (memory and time)*.
"""

from __future__ import annotations

import asyncio
import fcntl
import resource
import socket
import ssl
import struct
import termios
from collections.abc import Callable
from typing import Any, cast

from cuzkd.supervisor.core.idlewatch import Close, IdleWatch

#: Seconds a connection may go with no byte moved before it is closed.
IDLE_TIMEOUT = 10.0
#: Descriptors always left to the rest of the supervisor, and more per engine (its output
#: pipes, status connections, a spawn's transient pipes).
RESERVE_BASE = 32
RESERVE_PER_ENGINE = 8
#: Connections allowed whatever the limit (Prometheus needs one or two).
MIN_CONNECTIONS = 4
#: Seconds a TLS connection closing may wait for the client's close_notify.
TLS_SHUTDOWN_TIMEOUT = 2.0
#: After ``accept`` failed (descriptors short elsewhere), wait this long before accepting again.
ACCEPT_RETRY = 1.0
BACKLOG = 128


def connection_limit(engines: int) -> int:
    """Connections the listener may hold: the soft descriptor limit less the reserve."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MIN_CONNECTIONS, soft - RESERVE_BASE - RESERVE_PER_ENGINE * engines)


class GatedListener:
    """Listens on HOST:PORT and serves ``factory``'s protocol on at most ``limit()`` connections.

    ``on_accept_error(exc)`` is told of every failed ``accept``, ``on_limit(limit)`` of every
    connection refused at the limit, ``on_handshake_failed(exc)`` of every TLS handshake that
    failed or timed out (the caller rate-limits its logs). ``tls()``: the context a new
    connection is served with, None for plain HTTP.
    """

    def __init__(self, factory: Callable[[], asyncio.BaseProtocol], *,
                 limit: Callable[[], int], idle: float = IDLE_TIMEOUT,
                 tls: Callable[[], ssl.SSLContext | None] = lambda: None,
                 on_accept_error: Callable[[OSError], None] = lambda exc: None,
                 on_limit: Callable[[int], None] = lambda limit: None,
                 on_handshake_failed: Callable[[OSError], None] = lambda exc: None) -> None:
        self._factory = factory
        self._limit = limit
        self.idle = idle
        self._tls = tls
        self._on_accept_error = on_accept_error
        self._on_limit = on_limit
        self._on_handshake_failed = on_handshake_failed
        self._socks: list[socket.socket] = []
        self._accepting = False
        #: accepting is held (``cuzkd upgrade``: connections wait in the backlog for the new
        #: code)
        self._held = False
        self._retry: asyncio.TimerHandle | None = None
        self._handshakes: set[asyncio.Task[Any]] = set()
        #: connections open now (accepted, not yet closed)
        self.open = 0
        self.idle_closed_total = 0
        self.refused_total = 0
        #: TLS handshakes completed, and failed or timed out
        self.handshakes_total = 0
        self.handshakes_failed_total = 0

    async def start(self, host: str, port: int) -> list[tuple[str, int]]:
        """Bind every address ``host`` resolves to (like ``loop.create_server``); the bound
        (host, port) pairs. Raises OSError when one cannot be bound."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        unique = dict.fromkeys((family, kind, proto, address)
                               for family, kind, proto, _, address in infos)
        try:
            for family, kind, proto, address in unique:
                sock = socket.socket(family, kind, proto)
                self._socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(BACKLOG)
                sock.setblocking(False)
        except OSError:
            self.close()
            raise
        self._resume()
        return self.bound()

    def adopt(self, fds: list[int]) -> list[tuple[str, int]]:
        """Listen on the sockets the old code bound (``cuzkd upgrade``); the bound pairs."""
        for fd in fds:
            sock = socket.socket(fileno=fd)
            sock.set_inheritable(False)
            sock.setblocking(False)
            self._socks.append(sock)
        self._resume()
        return self.bound()

    def bound(self) -> list[tuple[str, int]]:
        return [cast(tuple[str, int], s.getsockname()[:2]) for s in self._socks]

    def filenos(self) -> list[int]:
        return [sock.fileno() for sock in self._socks]

    def hold(self, held: bool) -> None:
        """Stop accepting (connections wait in the backlog) or accept again."""
        self._held = held
        if held:
            self._pause()
        else:
            self._resume()

    def close(self) -> None:
        """Stop listening (open connections are the HTTP runner's to close)."""
        self._pause()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        for sock in self._socks:
            sock.close()
        self._socks = []
        for task in self._handshakes:
            task.cancel()

    # -- accepting -------------------------------------------------------------------------

    def _resume(self) -> None:
        if self._accepting or self._held or self._retry is not None or not self._socks:
            return
        loop = asyncio.get_running_loop()
        for sock in self._socks:
            loop.add_reader(sock, self._accept, sock)
        self._accepting = True

    def _pause(self) -> None:
        if not self._accepting:
            return
        loop = asyncio.get_running_loop()
        for sock in self._socks:
            loop.remove_reader(sock)
        self._accepting = False

    # asyncio's own server accepts as many connections as are pending. At the limit a client is
    # accepted and reset at once so it fails fast and tries again, rather than waiting in the
    # backlog while each batch of idle connections times out.
    def _accept(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(BACKLOG):  # then let the loop run other callbacks
            try:
                conn, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS...: try again a little later
                self._on_accept_error(exc)
                self._pause()
                self._retry = loop.call_later(ACCEPT_RETRY, self._retry_elapsed)
                return
            limit = self._limit()
            if self.open >= limit:
                self.refused_total += 1
                self._on_limit(limit)
                _linger_not(conn)
                conn.close()
                continue
            conn.setblocking(False)
            self.open += 1
            task = loop.create_task(self._serve(conn, self._tls()))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    def _retry_elapsed(self) -> None:
        self._retry = None
        self._resume()

    async def _serve(self, conn: socket.socket, context: ssl.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        counted = _Counted(self)
        try:
            if context is None:
                await loop.connect_accepted_socket(lambda: counted, conn)
                return
            # TLS through start_tls rather than connect_accepted_socket(ssl=...): the TCP
            # transport under TLS gets a high-water mark of 0 too, so a response's bytes wait
            # in cuzkd's memory one slice at a time as they do without TLS (its default would
            # hold 64 KiB more per connection, unseen by the outbox's send budget).
            raw, _ = await loop.connect_accepted_socket(_Unread, conn)
            raw.set_write_buffer_limits(high=0)
            tls = await loop.start_tls(raw, counted, context, server_side=True,
                                       ssl_handshake_timeout=self.idle,
                                       ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT)
        # ssl.SSLError, a handshake timeout, a reset during it: garbage instead of a ClientHello
        # fails at once, a silent or half-sent one when ``idle`` runs out
        except OSError as exc:
            conn.close()
            counted.release()
            if context is None:
                raise
            self.handshakes_failed_total += 1
            self._on_handshake_failed(exc)
        except BaseException:
            conn.close()
            counted.release()
            raise
        else:
            self.handshakes_total += 1
            # lost already (closing): its connection_lost releases it; start_tls returns None
            # only in typeshed's signature
            if tls is not None and not tls.is_closing():
                counted.connection_made(tls)

    def _released(self) -> None:
        self.open -= 1


class _Unread(asyncio.Protocol):
    """A TLS connection's TCP side until ``start_tls`` takes it over: it reads nothing, so the
    ClientHello waits in the kernel for the TLS layer."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).pause_reading()


class _Counted(asyncio.Protocol):
    """One connection: counted, closed after ``idle`` seconds with no byte moved, everything
    else passed to the HTTP server's protocol."""

    def __init__(self, listener: GatedListener) -> None:
        self._listener = listener
        self._inner: Any = listener._factory()  # aiohttp's RequestHandler
        self._transport: asyncio.Transport | None = None
        self._check: asyncio.TimerHandle | None = None
        self._idle = IdleWatch(listener.idle)
        self._released = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        # "Pause as soon as anything waits": asyncio's TLS transport pauses at size >= high
        # (0 would pause it with nothing to wait for, for good), its TCP one at size > high.
        tls = transport.get_extra_info("ssl_object") is not None
        self._transport.set_write_buffer_limits(high=1 if tls else 0)
        self._inner.connection_made(transport)
        self._moved()
        self._arm(self._listener.idle)

    def _moved(self) -> None:
        self._idle.moved(asyncio.get_running_loop().time())

    def _arm(self, delay: float) -> None:
        self._check = asyncio.get_running_loop().call_later(delay, self._look)

    def _look(self) -> None:
        """Carry out the idle rule's decision on the connection's queues now."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        queues = (transport.get_write_buffer_size(), _send_queue(transport))
        decision = self._idle.look(asyncio.get_running_loop().time(), queues)
        if isinstance(decision, Close):
            self._listener.idle_closed_total += 1
            reset(transport)
        else:
            self._arm(decision.after)

    def data_received(self, data: bytes) -> None:
        self._moved()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return cast(bool | None, self._inner.eof_received())

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._moved()
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._check is not None:
            self._check.cancel()
            self._check = None
        if self._transport is not None:  # None: a TLS connection lost before it was made
            self._inner.connection_lost(exc)
        self._transport = None
        self.release()

    def release(self) -> None:
        """No longer counted; once, however many ways the connection ended (a failed TLS
        handshake is told both to the listener and, by asyncio, as a lost connection)."""
        if not self._released:
            self._released = True
            self._listener._released()


def reset(transport: asyncio.Transport) -> None:
    """Close a connection cuzkd gives up on with a reset: what the kernel still holds for the
    client is dropped at once, rather than trickled out to it from an orphaned socket."""
    _linger_not(transport.get_extra_info("socket"))
    transport.abort()


def _linger_not(sock: Any) -> None:
    """RST rather than FIN on close: no TIME_WAIT, no queued bytes kept, the client knows at
    once (``sock`` a socket or asyncio's wrapper of one)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _send_queue(transport: asyncio.Transport) -> int:
    """Bytes the kernel holds for the connection, not yet acknowledged by the client."""
    sock = transport.get_extra_info("socket")
    try:
        out = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")  # = SIOCOUTQ
    except OSError:
        return 0
    return int(struct.unpack("i", out)[0])
