"""Every front door of the supervisor: bound before the engines start, closed after they stop.

One grpc.aio server per :class:`~cuzkd.config.doors.DoorPlan`, on the daemon's event loop,
with one generic handler (:class:`~.relay.DoorHandler`) and cuzk's 128 MiB message limit each
way. ``SO_REUSEPORT`` is off: a second process binding the same TCP port beside the door must
fail, not share Curio's calls. The doors are built once, from the config the supervisor starts
with (a reload changes engines, never the doors).

Under systemd's socket activation (``cuzkd.socket``) a door whose address a passed socket
listens on serves there (:mod:`.forward`) instead of binding: no address check (systemd's
socket answers by design) and no socket file removed at close (systemd's).

A door serves until its process exits: through cuzkd's shutdown it accepts and answers every
connection (grpc gives up on a connection without the server's SETTINGS after 20 s, so one
left in the kernel's backlog through a whole drain fails), sends deadline calls to the draining
engines and holds the rest; at the end it refuses what it still has, naming the restart, and
only then stops accepting, so the next connections wait in the kernel for the next cuzkd (a
passed socket stays open) for no longer than cuzkd's start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import structlog

from cuzkd.config.doors import DoorPlan
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.metrics.door_metrics import DoorMetrics
from cuzkd.supervisor.core.listenfds import match
from cuzkd.supervisor.door.binding import DoorAddressError, UnixAddress, UnixBind, claim
from cuzkd.supervisor.door.forward import PrivateSocket, SocketForward
from cuzkd.supervisor.door.inherited import Inherited
from cuzkd.supervisor.door.relay import Door, DoorHandler
from cuzkd.supervisor.engines.seat import DoorSeat
from cuzkd.supervisor.tasks import TaskSet

log = structlog.get_logger("cuzkd.supervisor")

#: The grace of the stop that only sends a door's GOAWAY when it closes: longer than any
#: shutdown, so that the close's own (shorter) grace is the one that counts.
GOAWAY_GRACE = 24 * 3600.0
#: The least time the refusals of a closing door get to reach their callers, however little is
#: left of shutdown_grace: each is one small HTTP/2 frame, and without it the caller would see
#: its call cancelled rather than why.
REFUSALS_GRACE = 1.0


class Doors:
    def __init__(self, plans: Sequence[DoorPlan], clock: Callable[[], float],
                 metrics: DoorMetrics, *, passed: Sequence[Inherited] = (),
                 state_dir: Path | None = None) -> None:
        """``metrics``: where every door's figures go (cuzkd_door_*); ``passed``: the
        sockets systemd passed (taken by :func:`.inherited.take_passed_sockets`), served on
        by the doors that listen there, their private sockets under ``state_dir``."""
        self._doors = [Door(plan, clock, metrics) for plan in plans]
        self._metrics = metrics
        self._servers: list[grpc.aio.Server] = []
        self._sockets: list[UnixBind] = []
        self._matching = match([p.passed for p in passed], [plan.address for plan in plans])
        self._passed = {p.passed: p.sock for p in passed}
        self._state_dir = state_dir
        self._forwards: list[SocketForward] = []
        self._private: list[PrivateSocket] = []
        self._limited = LimitedLog()

    @property
    def doors(self) -> list[Door]:
        return list(self._doors)

    def seat(self, engine: str) -> DoorSeat | None:
        """``engine``'s seat behind its door (None: no door in front of it)."""
        for door in self._doors:
            if engine in door.seats:
                return door.seats[engine]
        return None

    async def start(self) -> None:
        """Bind and start every door; DoorAddressError naming the address when one cannot
        (something answers there already, the bind fails)."""
        self._close_unused()
        if self._matching.by_door and self._state_dir is not None:
            PrivateSocket.remove_stale(self._state_dir)
        for door in self._doors:
            if door.plan.address in self._matching.by_door:
                self._servers.append(await self._serve_passed(door))
            else:
                self._servers.append(await self._serve(door))

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

    def _server(self, door: Door) -> grpc.aio.Server:
        plan = door.plan
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", plan.max_message_bytes),
            ("grpc.max_send_message_length", plan.max_message_bytes),
            ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((DoorHandler(door),))
        return server

    async def _serve_passed(self, door: Door) -> grpc.aio.Server:
        """The door on the socket systemd passed for its address (see :mod:`.forward`)."""
        plan = door.plan
        passed = self._matching.by_door[plan.address]
        if self._state_dir is None:
            raise DoorAddressError(f"front door {plan.address}: no state dir for the "
                                   "private socket of a passed socket")
        private = PrivateSocket(self._state_dir)
        self._private.append(private)
        server = self._server(door)
        try:
            server.add_insecure_port(private.target)
        except RuntimeError as exc:
            raise DoorAddressError(f"front door {plan.address}: cannot bind its private "
                                   f"socket {private.path}: {exc}") from None
        await server.start()
        forward = SocketForward(plan.name, self._passed[passed], private.path, self._limited)
        forward.start()
        self._forwards.append(forward)
        self._metrics.opened(plan.name, plan.engines)
        log.info("door_listening", door=plan.name, address=plan.address,
                 engines=list(plan.engines), passed_fd=passed.fd, fd_name=passed.name)
        return server

    async def _serve(self, door: Door) -> grpc.aio.Server:
        plan = door.plan
        where = await claim(plan.address)
        server = self._server(door)
        unix: UnixBind | None = None
        if isinstance(where, UnixAddress):
            unix = UnixBind(where, plan.socket_mode, plan.socket_group)
            target = unix.target
        else:
            target = where.target
            if where.wildcard:
                log.warning("door_exposed", door=plan.name, address=plan.address,
                            detail="a door on every interface takes an unauthenticated Prove "
                                   "from any host that reaches this one: bind it to loopback "
                                   "or a private address, or use a unix:// door")
        try:
            bound = server.add_insecure_port(target)
        except RuntimeError as exc:
            if unix is not None:
                unix.discard()
            raise DoorAddressError(f"front door {plan.address}: cannot bind: {exc}") from None
        if unix is not None:
            try:
                unix.publish()
            except OSError as exc:
                raise DoorAddressError(f"front door {plan.address}: {exc}") from None
            self._sockets.append(unix)
        await server.start()
        self._metrics.opened(plan.name, plan.engines)
        log.info("door_listening", door=plan.name, address=plan.address,
                 engines=list(plan.engines), **({} if unix is not None else {"port": bound}))
        return server

    async def close(self, grace: float) -> None:
        """Stop serving (the engines have stopped by now): a passed socket accepts nothing
        more (its next connections wait for the next cuzkd); every call still held or on an
        engine, and every call that comes now, is refused naming the restart, and gets
        ``grace`` seconds (at least :data:`REFUSALS_GRACE`) to leave; then the servers stop
        and the sockets go."""
        for forward in self._forwards:
            forward.stop_accepting()
        goaway = TaskSet()
        for server in self._servers:  # GOAWAY first: callers open their next call elsewhere
            goaway.start(server.stop(GOAWAY_GRACE))
        for door in self._doors:
            await door.closing(max(grace, REFUSALS_GRACE))
        for server in self._servers:
            await server.stop(grace)
        await goaway.wait()
        for forward in self._forwards:
            await forward.close()
        for door in self._doors:
            await door.close()
        for unix in self._sockets:
            unix.remove()
        for private in self._private:
            private.remove()
