"""Where a front door listens: nothing else may answer there, and a Unix socket is reachable
only with its mode and group.

Curio dials one address. If something already answers there -- an old ``cuzk`` unit still
enabled -- a door bound beside it (gRPC sets ``SO_REUSEPORT``; a Unix socket path can be
unlinked and bound again) would split Curio's calls between the two, and those reaching the
old cuzk would bypass every guarantee of the door: the start is refused, naming the address.
A socket file nobody answers on is a leftover of an earlier run and is removed.

A Unix socket's mode cannot be given at bind, so the supervisor binds it inside a fresh 0700
directory beside the final path, sets mode and group there, and renames it into place: from the
first moment Curio can reach the socket it has its final permissions (no process-wide umask is
touched: other threads and the reaper create files too). The supervisor binds each door's
socket and hands it to the door process, so it stays bound and listening while a door process
is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cuzkd.errors import DoorAddressError
from cuzkd.unixsock import remove_stale_socket

#: How long a connect to the door's address may take before nothing is taken to answer there
#: (a local address: an answer takes microseconds; a firewall dropping SYNs takes forever).
PROBE_TIMEOUT = 2.0
#: Hosts that bind every interface: a door there takes an unauthenticated ``Prove`` from any
#: machine that can reach the host.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


@dataclass(frozen=True)
class UnixAddress:
    path: Path


@dataclass(frozen=True)
class TcpAddress:
    host: str
    port: int

    @property
    def wildcard(self) -> bool:
        return self.host in WILDCARD_HOSTS

    @property
    def target(self) -> str:
        """grpc's spelling of the bind address (an IPv6 host in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(address: str) -> UnixAddress | TcpAddress:
    """``unix:///path`` or ``HOST:PORT`` (``[::1]:PORT``), as cuzk and Curio spell it; the
    config checks the spelling, so a bad one here is a bug caught as DoorAddressError."""
    if address.startswith("unix:"):
        return UnixAddress(Path(address.removeprefix("unix:").removeprefix("//")))
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise DoorAddressError(f"front door {address!r}: not unix:///PATH or HOST:PORT")
    return TcpAddress(host.strip("[]"), int(port))


async def answers(where: UnixAddress | TcpAddress) -> bool:
    """True when something accepts a connection at ``where`` now (a wildcard TCP address is
    probed on loopback)."""
    try:
        if isinstance(where, UnixAddress):
            connect = asyncio.open_unix_connection(os.fspath(where.path))
        else:
            host = ("::1" if ":" in where.host else "127.0.0.1") if where.wildcard else where.host
            connect = asyncio.open_connection(host, where.port)
        _, writer = await asyncio.wait_for(connect, PROBE_TIMEOUT)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def claim(address: str) -> UnixAddress | TcpAddress:
    """The parsed ``address`` once nothing answers there (a stale socket file removed);
    DoorAddressError naming it when something does."""
    where = parse_address(address)
    if await answers(where):
        raise DoorAddressError(
            f"front door {address}: something already answers there (an old cuzk service "
            "still enabled?); stop it, or set the engine's door to another address or \"off\"")
    if isinstance(where, UnixAddress):
        try:
            remove_stale_socket(where.path)
        except OSError as exc:
            raise DoorAddressError(f"front door {address}: {exc}") from None
    return where


def group_id(group: str) -> int | None:
    """The gid of ``socket_group`` (a name or a number; "" = cuzkd's own: None)."""
    if not group:
        return None
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise DoorAddressError(f"front door socket_group {group!r}: no such group") from None


class UnixBind:
    """A Unix socket bound in a private directory, given its mode and group there and renamed
    to its final path (see the module's docstring)."""

    def __init__(self, where: UnixAddress, mode: int, group: str) -> None:
        self.final = where.path
        self._mode, self._gid = mode, group_id(group)
        self._inode: int | None = None

    def listen(self) -> socket.socket:
        """The listening socket at the final path, with its mode and group from the first
        moment Curio can reach it; DoorAddressError naming the address when that fails."""
        try:
            staging = Path(tempfile.mkdtemp(prefix=".door-", dir=self.final.parent))
        except OSError as exc:  # no such directory, not ours to write: the unit's to make
            raise DoorAddressError(f"front door unix://{self.final}: cannot create its "
                                   f"socket in {self.final.parent}: {exc.strerror}") from None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            staged = staging / "s"
            sock.bind(os.fspath(staged))
            staged.chmod(self._mode)
            if self._gid is not None:
                os.chown(staged, -1, self._gid)
            staged.rename(self.final)
            self._inode = self.final.lstat().st_ino
            sock.listen(socket.SOMAXCONN)
        except OSError as exc:
            sock.close()
            raise DoorAddressError(f"front door unix://{self.final}: {exc}") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return sock

    @classmethod
    def published(cls, where: UnixAddress, mode: int, group: str) -> UnixBind:
        """The socket the old code published at ``where`` (``cuzkd upgrade``): this program
        removes it at close, as if it had bound it."""
        bind = cls(where, mode, group)
        with contextlib.suppress(OSError):
            bind._inode = where.path.lstat().st_ino
        return bind

    def remove(self) -> None:
        """Unlink the socket at close, if the file there is still the one published (a
        successor may have bound its own since)."""
        with contextlib.suppress(OSError):
            if self._inode is not None and self.final.lstat().st_ino == self._inode:
                self.final.unlink()


def listen_tcp(where: TcpAddress) -> socket.socket:
    """A listening TCP socket at ``where``, without ``SO_REUSEPORT`` (a second process bound
    to the port beside the door must fail, not share Curio's calls); DoorAddressError naming
    the address when the bind fails."""
    family = socket.AF_INET6 if ":" in where.host else socket.AF_INET
    try:
        return socket.create_server((where.host, where.port), family=family,
                                    backlog=socket.SOMAXCONN, reuse_port=False)
    except OSError as exc:
        raise DoorAddressError(f"front door {where.target}: cannot bind: {exc}") from None
