"""Every door's listening socket, held by the supervisor from before the engines start until it
exits: the one systemd passed where it listens at the door's address, else one bound here
(:mod:`.binding`). The door process gets them as inherited descriptors, so a connection made
while it is replaced waits in the kernel's backlog.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import structlog

from cuzkd.config.doors import DoorPlan
from cuzkd.supervisor.core.listenfds import match
from cuzkd.supervisor.door.binding import (
    UnixAddress,
    UnixBind,
    claim,
    listen_tcp,
    parse_address,
)
from cuzkd.supervisor.door.inherited import Inherited

log = structlog.get_logger("cuzkd.supervisor")


class DoorSockets:
    """The sockets of ``plans``' doors; ``passed``: the sockets systemd passed
    (:func:`.inherited.take_passed_sockets`), each the socket of the door that listens there."""

    def __init__(self, plans: Sequence[DoorPlan], passed: Sequence[Inherited]) -> None:
        self._plans = tuple(plans)
        self._matching = match([p.passed for p in passed], [plan.address for plan in plans])
        self._passed = {p.passed: p.sock for p in passed}
        #: door address -> its listening socket
        self._sockets: dict[str, socket.socket] = {}
        self._unix: list[UnixBind] = []

    async def open(self) -> None:
        """Take or bind every door's socket (the passed ones no door listens on closed);
        DoorAddressError naming the address when a door cannot listen."""
        self._close_unused()
        for plan in self._plans:
            sock = self._sockets[plan.address] = await self._listen(plan)
            log.info("door_listening", door=plan.name, address=plan.address,
                     engines=list(plan.engines), **self._where(plan, sock))

    def adopt(self, handed: dict[str, int]) -> None:
        """Take the sockets the old code listened on (``cuzkd upgrade``): door address ->
        descriptor. A Unix door's file is the one published, removed at close as if bound
        here."""
        for plan in self._plans:
            sock = self._sockets[plan.address] = socket.socket(fileno=handed[plan.address])
            sock.set_inheritable(False)
            where = parse_address(plan.address)
            if isinstance(where, UnixAddress):
                self._unix.append(UnixBind.published(where, plan.socket_mode, plan.socket_group))

    def fileno(self, address: str) -> int:
        """The descriptor of the door listening at ``address``."""
        return self._sockets[address].fileno()

    def by_address(self) -> dict[str, int]:
        """Door address -> descriptor, for the hand-over."""
        return {address: sock.fileno() for address, sock in self._sockets.items()}

    def filenos(self) -> list[int]:
        """Every door's descriptor, for the door process to inherit."""
        return [sock.fileno() for sock in self._sockets.values()]

    def close(self) -> None:
        """cuzkd exits: the sockets close, a Unix socket's file is removed."""
        for sock in self._sockets.values():
            sock.close()
        for unix in self._unix:
            unix.remove()

    def _where(self, plan: DoorPlan, sock: socket.socket) -> dict[str, Any]:
        """What ``door_listening`` says of the socket: the descriptor systemd passed, or the
        port a TCP door bound."""
        if (passed := self._matching.by_door.get(plan.address)) is not None:
            return {"passed_fd": passed.fd, "fd_name": passed.name}
        if sock.family != socket.AF_UNIX:
            return {"port": sock.getsockname()[1]}
        return {}

    def _close_unused(self) -> None:
        for passed in self._matching.unused:
            log.warning("door_socket_unused", fd=passed.fd, fd_name=passed.name,
                        listening_at=":".join(map(str, passed.key or ("-",))),
                        detail="no door listens there: closed (systemd keeps it); the "
                               "socket unit's ListenStream= must be the door's address")
            self._passed[passed].close()
        for address in self._matching.unpassed:
            log.warning("door_socket_not_passed", address=address,
                        detail="systemd passed sockets but none listens there: the door "
                               "binds its own, which a restart of cuzkd closes")

    async def _listen(self, plan: DoorPlan) -> socket.socket:
        if (passed := self._matching.by_door.get(plan.address)) is not None:
            return self._passed[passed]
        where = await claim(plan.address)
        if not isinstance(where, UnixAddress):
            if where.wildcard:
                log.warning("door_exposed", door=plan.name, address=plan.address,
                            detail="a door on every interface takes an unauthenticated Prove "
                                   "from any host that reaches this one: bind it to loopback "
                                   "or a private address, or use a unix:// door")
            return listen_tcp(where)
        unix = UnixBind(where, plan.socket_mode, plan.socket_group)
        sock = unix.listen()
        self._unix.append(unix)
        return sock
