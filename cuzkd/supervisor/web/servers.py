"""The supervisor's two HTTP faces, bound and closed together.

The control API listens only on its 0600 Unix socket (:func:`cuzkd.unixsock.bind_private_socket`);
the read-only metrics app on ``metrics.listen`` through the :class:`GatedListener`, which holds
the connection count under the descriptor limit, and its :class:`Outbox`, which bounds the bytes
and the time its responses take; TLS comes from ``metrics.web_config``
(:class:`~cuzkd.supervisor.web.access.WebAccess`). Either failing to bind is a
:class:`StartupError` naming the address: the daemon logs it and exits 1 before any engine
starts.

Closing is bounded (:meth:`Servers.close`): a request still being handled when the supervisor
exits -- a ``cuzkd swap`` stream, a ``cuzkd restart`` waiting on its engine -- gets what is left
of ``shutdown_grace``, then is cancelled; aiohttp's own default would wait 60 s for it, and again
60 s for it to end cancelled, with the state dir still locked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections.abc import Callable
from pathlib import Path

import structlog
from aiohttp import web

from cuzkd.errors import StartupError
from cuzkd.httperrors import JsonErrorsRunner
from cuzkd.log.ratelimit import LimitedLog, errno_name
from cuzkd.states import ConnectionClose
from cuzkd.supervisor.core.handover import Listeners
from cuzkd.supervisor.web.listener import IDLE_TIMEOUT, GatedListener
from cuzkd.supervisor.web.outbox import Outbox
from cuzkd.units import parse_listen
from cuzkd.unixsock import bind_private_socket

log = structlog.get_logger("cuzkd.supervisor")

#: The least a request still in progress at exit gets to end, even with no grace left (aiohttp
#: reads a wait of 0 as "no limit").
MIN_HANDLER_WAIT = 0.5


class Servers:
    def __init__(self, limited: LimitedLog) -> None:
        #: repeated errors (accept failing, refused connections) log once per 10 s per kind
        self._limited = limited
        self._runners: list[web.AppRunner] = []
        self._listener: GatedListener | None = None
        #: sends the metrics app's bodies (the app is built with it, before start)
        self.outbox = Outbox()
        self._control_socket: Path | None = None
        #: the control socket's runner, its listening socket and the server accepting on it
        self._control_runner: web.AppRunner | None = None
        self._control_sock: socket.socket | None = None
        self._control_server: asyncio.AbstractServer | None = None
        #: while held for an upgrade: a descriptor keeping the control socket listening
        self._control_held: int | None = None

    async def start(self, control: web.Application, control_socket: Path,
                    metrics: web.Application, metrics_listen: str,
                    connection_limit: Callable[[], int],
                    tls: Callable[[], ssl.SSLContext | None] = lambda: None,
                    bound: Callable[[str, int], None] = lambda host, port: None,
                    handed: Listeners | None = None) -> None:
        """Serve both apps. ``tls``: the context each new metrics connection gets
        (:meth:`WebAccess.tls`), None for plain HTTP. ``bound`` is told the metrics
        listener's (host, port) before the control socket answers anything. ``handed``: the
        listeners of the program this one replaced (``cuzkd upgrade``), served as they are."""
        control_runner = JsonErrorsRunner(control, handle_signals=False, access_log=None)
        metrics_runner = JsonErrorsRunner(metrics, handle_signals=False, access_log=None,
                                          keepalive_timeout=IDLE_TIMEOUT)
        for runner in (control_runner, metrics_runner):
            await runner.setup()
            self._runners.append(runner)
        # The metrics listener first, and its address told: once the control socket answers,
        # /v1/supervisor names the bound metrics address, never null (a client that read it
        # right after start found nothing to scrape).
        address = parse_listen(metrics_listen, allow_unix=False)
        assert metrics_runner.server is not None  # set up above
        self._listener = GatedListener(
            metrics_runner.server, limit=connection_limit, tls=tls,
            on_accept_error=self._on_accept_error, on_limit=self._on_limit,
            on_handshake_failed=self._on_handshake_failed)
        try:
            listening = (self._listener.adopt(handed.metrics) if handed is not None
                         else await self._listener.start(address.host, address.port))
        except OSError as exc:
            raise StartupError(f"cannot listen on metrics.listen {metrics_listen}: "
                               f"{exc.strerror}") from None
        host, port = listening[0]
        bound(str(host), int(port))
        try:
            sock = (socket.socket(fileno=handed.control) if handed is not None
                    else bind_private_socket(control_socket, make_parent=True))
        except OSError as exc:
            raise StartupError(f"cannot bind control socket {control_socket}: "
                               f"{exc.strerror}") from None
        sock.set_inheritable(False)
        self._control_socket, self._control_runner = control_socket, control_runner
        await self._serve_control(sock)

    async def _serve_control(self, sock: socket.socket) -> None:
        """Accept control connections on ``sock`` (a server of our own rather than aiohttp's
        site: :meth:`quiesce` stops it without closing the socket)."""
        assert self._control_runner is not None and self._control_runner.server is not None
        self._control_sock = sock
        self._control_server = await asyncio.get_running_loop().create_server(
            self._control_runner.server, sock=sock)

    def handover(self) -> Listeners:
        """Both listeners' descriptors, for the program that replaces the supervisor."""
        assert self._listener is not None and self._control_sock is not None
        control = (self._control_held if self._control_held is not None
                   else self._control_sock.fileno())
        return Listeners(control, self._listener.filenos())

    async def quiesce(self, within: float) -> None:
        """Stop accepting on both listeners and let the metrics responses in flight end, for
        ``within`` seconds at most: the connections that come meanwhile wait in the backlog
        for the program that replaces this one (``cuzkd upgrade``)."""
        if self._control_server is not None and self._control_sock is not None:
            # a duplicate keeps the socket listening while the server closes its own
            self._control_held = os.dup(self._control_sock.fileno())
            self._control_server.close()
            self._control_server = None
        if self._listener is not None:
            self._listener.hold(True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.outbox.idle(), within)

    async def resume(self) -> None:
        """Accept again (the upgrade did not happen)."""
        if self._listener is not None:
            self._listener.hold(False)
        if self._control_held is not None:
            held, self._control_held = self._control_held, None
            await self._serve_control(socket.socket(fileno=held))

    async def close(self, within: float) -> None:
        """Stop listening, and end within about ``within`` seconds (at least
        :data:`MIN_HANDLER_WAIT`) however long the requests in progress would take."""
        if self._listener is not None:
            self._listener.close()
        if self._control_server is not None:
            self._control_server.close()
        # aiohttp waits its shutdown_timeout twice -- for the handlers to end, then for the
        # cancelled ones to unwind -- and takes it only at construction (a private attribute
        # since): each wait gets half of what is left, the two runners close side by side.
        wait = max(MIN_HANDLER_WAIT, within / 2)
        for runner in self._runners:
            runner._shutdown_timeout = wait
        await asyncio.gather(*(runner.cleanup() for runner in self._runners))
        if self._control_socket is not None:  # ours only once bound
            self._control_socket.unlink(missing_ok=True)

    def connections_closed(self) -> dict[str, int]:
        """Connections of the metrics listener cuzkd closed, by :class:`ConnectionClose`."""
        listener = self._listener
        return {ConnectionClose.REFUSED: listener.refused_total if listener else 0,
                ConnectionClose.IDLE: listener.idle_closed_total if listener else 0,
                **self.outbox.closed_total}

    def handshakes(self) -> tuple[int, int]:
        """TLS handshakes of the metrics listener: (completed, failed or timed out)."""
        listener = self._listener
        return (listener.handshakes_total, listener.handshakes_failed_total) if listener \
            else (0, 0)

    def _on_handshake_failed(self, exc: OSError) -> None:
        # The reason is OpenSSL's (or "timed out"): never anything the client sent.
        reason = getattr(exc, "reason", None) or type(exc).__name__
        self._limited.log(log, "warning", "metrics_tls_handshake_failed", key=reason,
                          reason=reason, detail="a client's TLS handshake failed or did not "
                                                "finish within 10 s; it was closed")

    def _on_limit(self, limit: int) -> None:
        self._limited.log(log, "warning", "metrics_connection_refused", limit=limit,
                          detail="at the connection limit (descriptor limit less a reserve); "
                                 "connections with no byte moved for 10 s are closed")

    def _on_accept_error(self, exc: OSError) -> None:
        self._limited.log(log, "error", "metrics_accept_failed", key=errno_name(exc),
                          error=str(exc), errno=errno_name(exc))
