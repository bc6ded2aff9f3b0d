"""A door on a socket systemd passed: connections accepted there, each piped to the door's
grpc server on a private socket.

grpcio serves only on addresses it binds itself: the C core's systemd support and its
``grpc_server_add_insecure_channel_from_fd`` are in no Python API (nor built into the wheels),
so a passed socket cannot be handed to grpc. The door's server therefore listens on a Unix
socket in a fresh 0700 directory under the state dir, and this accept loop pipes each
connection Curio makes on the passed socket to it byte for byte (HTTP/2 is not parsed: grpc
still sees every frame). Reads are paused while the other side's buffer is full, so a slow
reader holds at most one transport buffer per side; at most ``MAX_CONNECTIONS`` connections
are piped at once, and further ones wait in the kernel's backlog, as they do while no cuzkd
runs.

:meth:`SocketForward.stop_accepting` is the restart's handover: the connections not yet
accepted stay in the backlog for the next cuzkd.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from pathlib import Path

import structlog

from cuzkd.log.ratelimit import LimitedLog
from cuzkd.supervisor.door.binding import DoorAddressError
from cuzkd.supervisor.tasks import TaskSet

log = structlog.get_logger("cuzkd.supervisor")

#: connections piped at once (3 descriptors each; the unit allows 65536)
MAX_CONNECTIONS = 1024
#: a failed accept (descriptors exhausted) is tried again after this long
ACCEPT_RETRY = 0.1


class _Half(asyncio.Protocol):
    """One side of a piped connection: what it reads is written to the other side."""

    def __init__(self, ended: asyncio.Event) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: asyncio.Transport | None = None
        self._ended = ended

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.peer is not None
        self.peer.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()  # what it was sent still goes first
        self._ended.set()

    # Our transport's buffer (data for our side) is full: stop reading the other side.
    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and not self.peer.is_closing():
            self.peer.resume_reading()


class SocketForward:
    """Connections on ``listener`` (a passed listening socket), piped to ``target``."""

    def __init__(self, door: str, listener: socket.socket, target: Path,
                 limited: LimitedLog) -> None:
        self.door = door
        self._listener, self._target, self._limited = listener, target, limited
        self._listener.setblocking(False)
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._accepting = TaskSet()
        self._accept_task: asyncio.Task[None] | None = None
        self._pipes = TaskSet()
        self._transports: set[asyncio.Transport] = set()

    def start(self) -> None:
        self._accept_task = self._accepting.start(self._accept())

    def stop_accepting(self) -> None:
        """Accept nothing more: new connections wait in the kernel for the next cuzkd."""
        if self._accept_task is not None:
            self._accept_task.cancel()

    async def close(self) -> None:
        """Stop accepting, end every pipe, close this process's copy of the socket (systemd
        keeps its own)."""
        await self._accepting.cancel_all()
        for transport in list(self._transports):
            transport.abort()
        await self._pipes.wait()
        self._listener.close()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()
            try:
                conn, _ = await loop.sock_accept(self._listener)
            except OSError as exc:
                self._slots.release()
                self._limited.log(log, "warning", "door_accept_failed", key=self.door,
                                  door=self.door, error=str(exc))
                await asyncio.sleep(ACCEPT_RETRY)
                continue
            except BaseException:
                self._slots.release()
                raise
            self._pipes.start(self._pipe(conn))

    async def _pipe(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        ended = asyncio.Event()
        near, far = _Half(ended), _Half(ended)
        try:
            try:
                up, _ = await loop.create_unix_connection(lambda: far, str(self._target))
            except OSError as exc:
                conn.close()
                self._limited.log(log, "warning", "door_accept_failed", key=self.door,
                                  door=self.door, error=f"the door's server: {exc}")
                return
            up.pause_reading()  # grpc's first frames wait until the caller's side exists
            try:
                down, _ = await loop.connect_accepted_socket(lambda: near, conn)
            except OSError:
                up.close()
                return
            near.peer, far.peer = up, down
            self._transports |= {up, down}
            up.resume_reading()
            try:
                await ended.wait()
            finally:
                # the first side to end closes the other (after what it was sent), or both
                # go at close()
                up.close()
                down.close()
                self._transports -= {up, down}
        finally:
            self._slots.release()


class PrivateSocket:
    """Where a forwarded door's grpc server listens: a socket in a fresh 0700 directory
    under the state dir, reachable by cuzkd's own user only."""

    def __init__(self, state_dir: Path) -> None:
        try:
            self._dir = Path(tempfile.mkdtemp(prefix=".door-", dir=state_dir))
        except OSError as exc:
            raise DoorAddressError(f"front door: cannot create its private socket in "
                                   f"{state_dir}: {exc.strerror}") from None
        self.path = self._dir / "s"

    @property
    def target(self) -> str:
        return f"unix:{self.path}"

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            shutil.rmtree(self._dir)
