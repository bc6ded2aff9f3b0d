"""The listening sockets systemd passed to this process, taken once at start.

:mod:`~cuzkd.supervisor.core.listenfds` decides what was passed and which door each socket
is; this takes them: the ``LISTEN_*`` variables are removed from the environment (an engine
inherits the supervisor's environment, and a cuzk that saw them could take its parent's
socket), every descriptor gets ``FD_CLOEXEC`` (no engine inherits the socket itself), and each
is asked where it listens.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping
from dataclasses import dataclass

import structlog

from cuzkd.supervisor.core.listenfds import (
    LISTEN_VARIABLES,
    PassedSocket,
    SocketKey,
    passed_fds,
    tcp_key,
    unix_key,
)

log = structlog.get_logger("cuzkd.supervisor")


@dataclass(frozen=True)
class Inherited:
    passed: PassedSocket
    sock: socket.socket


def take_passed_sockets(environ: MutableMapping[str, str]) -> list[Inherited]:
    """The sockets ``environ`` passes to this process (none without systemd); the
    variables are gone from ``environ`` afterwards in every case."""
    passed = passed_fds(environ, os.getpid())
    for name in LISTEN_VARIABLES:
        environ.pop(name, None)
    if passed.ignored:
        log.info("listen_fds_ignored", reason=passed.ignored)
    taken = []
    for fd, name in zip(passed.fds, passed.names, strict=True):
        try:
            os.set_inheritable(fd, False)
            sock = socket.socket(fileno=fd)
        except OSError as exc:  # not open, not a socket: nothing a door can serve on
            log.warning("door_socket_unused", fd=fd, fd_name=name, error=str(exc))
            continue
        taken.append(Inherited(PassedSocket(fd, name, _listening_at(sock)), sock))
    return taken


def _listening_at(sock: socket.socket) -> SocketKey | None:
    """Where ``sock`` listens; None unless it is a listening stream socket."""
    try:
        if (sock.type != socket.SOCK_STREAM
                or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
            return None
        where = sock.getsockname()
    except OSError:
        return None
    if sock.family == socket.AF_UNIX:
        # an abstract or unnamed socket: no path a door could name
        return unix_key(where) if isinstance(where, str) and where.startswith("/") else None
    return tcp_key(where[0], where[1])
