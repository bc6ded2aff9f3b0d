"""A door on a socket systemd passed: connections accepted there, each piped to the door's
grpc server on a private socket.

grpcio serves only on addresses it binds itself: the C core's systemd support and its
``grpc_server_add_insecure_channel_from_fd`` are in no Python API (nor built into the wheels),
so a passed socket cannot be handed to grpc. The door's server therefore listens on a Unix
socket in a fresh 0700 directory under the state dir, and this accept loop pipes each
connection Curio makes on the passed socket to it byte for byte (HTTP/2 is not parsed: grpc
still sees every frame). The bytes move in the kernel: ``splice(2)`` through a pipe, one
thread per direction blocked in it, so no byte enters Python and the event loop does nothing
per byte (an asyncio pipe, tried first, cost a 51 MB request ~140 ms and 2.5 CPU s per GB;
this one nothing measurable, docs/benchmarks.md). A slow reader stops the splice feeding it,
so it holds at most a pipe and two socket buffers; at most ``MAX_CONNECTIONS`` connections
are piped at once (Curio keeps one or two), further ones wait in the kernel's backlog, as
they do while no cuzkd runs.

:meth:`SocketForward.stop_accepting` is the restart's handover: the connections not yet
accepted stay in the backlog for the next cuzkd.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import structlog

from cuzkd.log.ratelimit import LimitedLog
from cuzkd.supervisor.door.binding import DoorAddressError
from cuzkd.supervisor.tasks import TaskSet

log = structlog.get_logger("cuzkd.supervisor")

#: connections piped at once (two threads and five descriptors each)
MAX_CONNECTIONS = 256
#: a failed accept (descriptors exhausted) is tried again after this long
ACCEPT_RETRY = 0.1
#: bytes moved per splice, and the pipe between (1 MiB is the unprivileged maximum,
#: /proc/sys/fs/pipe-max-size)
PIPE_BYTES = 1 << 20
#: the private sockets' directories (one per door; a killed cuzkd's are removed at start)
PRIVATE_PREFIX = ".door-"


def _splice(src: socket.socket, dst: socket.socket) -> None:
    """Move bytes ``src`` -> ``dst`` until ``src`` ends, in the kernel (a pipe between: no
    byte enters Python, the GIL is free meanwhile); then end ``dst``'s writing half."""
    read_end, write_end = os.pipe()
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        while moved := os.splice(src.fileno(), write_end, PIPE_BYTES):
            while moved:
                moved -= os.splice(read_end, dst.fileno(), moved)
    except OSError:
        pass  # either side broke (or close() shut it): the other learns at once below
    finally:
        os.close(read_end)
        os.close(write_end)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class SocketForward:
    """Connections on ``listener`` (a passed listening socket), piped to ``target``."""

    def __init__(self, door: str, listener: socket.socket, target: Path,
                 limited: LimitedLog, max_connections: int = MAX_CONNECTIONS) -> None:
        self.door = door
        self._listener, self._target, self._limited = listener, target, limited
        self._listener.setblocking(False)
        self._slots = asyncio.Semaphore(max_connections)
        self._accepting = TaskSet()
        self._accept_task: asyncio.Task[None] | None = None
        self._pipes = TaskSet()
        #: the sockets of the pipes under way (shut down at close)
        self._sockets: set[socket.socket] = set()

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
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
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
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.setblocking(False)
            try:
                await loop.sock_connect(up, str(self._target))
            except OSError as exc:
                self._limited.log(log, "warning", "door_accept_failed", key=self.door,
                                  door=self.door, error=f"the door's server: {exc}")
                return
            up.setblocking(True)
            conn.setblocking(True)
            self._sockets |= {up, conn}
            splicing = self._start_splices(loop, conn, up)
            try:
                if len(splicing) == 2:
                    await asyncio.wait(splicing)  # both directions over
            finally:
                # cancelled, or a thread missing: end the splices before their sockets close
                # (a descriptor closed under a thread could be another file when it runs on)
                for sock in (up, conn):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                if splicing:
                    await asyncio.wait(splicing)
        finally:
            self._sockets -= {up, conn}
            up.close()
            conn.close()
            self._slots.release()

    def _start_splices(self, loop: asyncio.AbstractEventLoop, conn: socket.socket,
                       up: socket.socket) -> list[asyncio.Future[None]]:
        """A thread per direction; each one's end, for those that started."""
        splicing: list[asyncio.Future[None]] = []
        for src, dst in ((conn, up), (up, conn)):
            done: asyncio.Future[None] = loop.create_future()
            try:
                threading.Thread(target=self._run_splice, args=(loop, src, dst, done),
                                 name=f"door-{self.door}", daemon=True).start()
            except RuntimeError as exc:  # no thread to be had: this connection goes
                self._limited.log(log, "warning", "door_accept_failed", key=self.door,
                                  door=self.door, error=str(exc))
                break
            splicing.append(done)
        return splicing

    @staticmethod
    def _run_splice(loop: asyncio.AbstractEventLoop, src: socket.socket, dst: socket.socket,
                    done: asyncio.Future[None]) -> None:
        try:
            _splice(src, dst)
        finally:
            loop.call_soon_threadsafe(done.set_result, None)


class PrivateSocket:
    """Where a forwarded door's grpc server listens: a socket in a fresh 0700 directory
    under the state dir, reachable by cuzkd's own user only."""

    def __init__(self, state_dir: Path) -> None:
        try:
            self._dir = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir=state_dir))
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

    @staticmethod
    def remove_stale(state_dir: Path) -> None:
        """The directories a killed cuzkd left (the state dir's lock is ours: no other
        cuzkd uses them)."""
        for stale in state_dir.glob(PRIVATE_PREFIX + "*"):
            shutil.rmtree(stale, ignore_errors=True)
