"""Every front door of the supervisor: bound before the engines start, closed after they stop.

One grpc.aio server per :class:`~cuzkd.config.doors.DoorPlan`, on the daemon's event loop,
with one generic handler (:class:`~.relay.DoorHandler`) and cuzk's 128 MiB message limit each
way. ``SO_REUSEPORT`` is off: a second process binding the same TCP port beside the door must
fail, not share Curio's calls. The doors are built once, from the config the supervisor starts
with (a reload changes engines, never the doors).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc
import structlog

from cuzkd.config.doors import DoorPlan
from cuzkd.metrics.door_metrics import DoorMetrics
from cuzkd.supervisor.door.binding import DoorAddressError, UnixAddress, UnixBind, claim
from cuzkd.supervisor.door.relay import Door, DoorHandler
from cuzkd.supervisor.engines.seat import DoorSeat

log = structlog.get_logger("cuzkd.supervisor")


class Doors:
    def __init__(self, plans: Sequence[DoorPlan], clock: Callable[[], float],
                 metrics: DoorMetrics) -> None:
        """``metrics``: where every door's figures go (cuzkd_door_*)."""
        self._doors = [Door(plan, clock, metrics) for plan in plans]
        self._metrics = metrics
        self._servers: list[grpc.aio.Server] = []
        self._sockets: list[UnixBind] = []

    def seat(self, engine: str) -> DoorSeat | None:
        """``engine``'s seat behind its door (None: no door in front of it)."""
        for door in self._doors:
            if engine in door.seats:
                return door.seats[engine]
        return None

    async def start(self) -> None:
        """Bind and start every door; DoorAddressError naming the address when one cannot
        (something answers there already, the bind fails)."""
        for door in self._doors:
            self._servers.append(await self._serve(door))

    async def _serve(self, door: Door) -> grpc.aio.Server:
        plan = door.plan
        where = await claim(plan.address)
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", plan.max_message_bytes),
            ("grpc.max_send_message_length", plan.max_message_bytes),
            ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((DoorHandler(door),))
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

    def refuse_new(self) -> None:
        """The supervisor shuts down: every door refuses held and new calls at once."""
        for door in self._doors:
            door.refuse_new()

    async def close(self, grace: float) -> None:
        """Stop serving: calls still in flight get ``grace`` seconds (the engines have
        stopped by now: they are answered or lost), then the sockets go."""
        for server in self._servers:
            await server.stop(grace)
        for door in self._doors:
            await door.close()
        for unix in self._sockets:
            unix.remove()
