"""Sockets systemd passed (``LISTEN_FDS``), and which front door each one is.

systemd's socket activation (``cuzkd.socket``) keeps the door's listening socket open while
cuzkd restarts: Curio's connects wait in the kernel's backlog, and the next cuzkd takes the
socket over. This module holds the two decisions, made from values: what the environment
passed (sd_listen_fds(3)'s rules: the fds start at 3, they are ours only when ``LISTEN_PID``
is our pid, ``LISTEN_FDNAMES`` names them colon-separated), and which door each socket is --
by the address the socket is bound to (``getsockname``), so a unit whose
``FileDescriptorName=`` was edited or left out still matches; the name is only reported.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

#: sd_listen_fds(3): the first passed descriptor
LISTEN_FDS_START = 3
#: the variables systemd sets; removed once read, so that no engine inherits them
LISTEN_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
#: more than this many is not systemd's doing (a unit passes one socket per ListenStream=)
MAX_PASSED = 64
#: the name sd_listen_fds_with_names(3) gives a descriptor that LISTEN_FDNAMES does not name
UNKNOWN_NAME = "unknown"
#: hosts that mean "every interface" (systemd's ``ListenStream=PORT`` binds ``[::]``)
_WILDCARDS = frozenset({ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::")})

#: a socket's address as compared: ("unix", path) or ("tcp", host, port); host "*" = every
#: interface
SocketKey = tuple[str, str] | tuple[str, str, int]


@dataclass(frozen=True)
class Passed:
    """What the environment passed: ``fds`` with their ``names``, or none and why."""

    fds: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    #: set when LISTEN_* were present but the fds are not ours to take
    ignored: str = ""


def passed_fds(env: Mapping[str, str], pid: int) -> Passed:
    """The descriptors ``env`` passes to process ``pid``."""
    if "LISTEN_FDS" not in env:
        return Passed()
    if env.get("LISTEN_PID", "") != str(pid):
        return Passed(ignored=f"LISTEN_PID={env.get('LISTEN_PID', '')[:20]!r} is not this "
                              f"process ({pid})")
    count = env["LISTEN_FDS"]
    if not (count.isascii() and count.isdigit()) or not 0 < int(count) <= MAX_PASSED:
        return Passed(ignored=f"LISTEN_FDS={count[:20]!r} is not a count from 1 to "
                              f"{MAX_PASSED}")
    fds = tuple(range(LISTEN_FDS_START, LISTEN_FDS_START + int(count)))
    names = env["LISTEN_FDNAMES"].split(":") if "LISTEN_FDNAMES" in env else []
    if len(names) != len(fds):
        names = [UNKNOWN_NAME] * len(fds)
    return Passed(fds=fds, names=tuple(names))


def unix_key(path: str) -> SocketKey:
    return ("unix", str(PurePosixPath(path)))


def tcp_key(host: str, port: int) -> SocketKey | None:
    """An IP literal's key (None for a host name: it is not compared, never resolved)."""
    try:
        ip = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ("tcp", "*" if ip in _WILDCARDS else str(ip), port)


def door_key(address: str) -> SocketKey | None:
    """A door address's key: ``unix:///PATH`` or ``HOST:PORT`` as the config spells it."""
    if address.startswith("unix:"):
        return unix_key(address.removeprefix("unix:").removeprefix("//"))
    host, _, port = address.rpartition(":")
    return tcp_key(host, int(port)) if port.isdigit() else None


@dataclass(frozen=True)
class PassedSocket:
    fd: int
    name: str
    #: where it listens (None: not a listening stream socket, so no door's)
    key: SocketKey | None


@dataclass(frozen=True)
class Matching:
    #: door address -> the passed socket it serves on
    by_door: Mapping[str, PassedSocket]
    #: passed sockets no door listens on (closed, logged)
    unused: tuple[PassedSocket, ...]
    #: doors that bind their own socket although sockets were passed (logged)
    unpassed: tuple[str, ...]


def match(passed: Sequence[PassedSocket], doors: Sequence[str]) -> Matching:
    """Each door with the first passed socket at its address; with nothing passed, every
    door binds as before and nothing is reported."""
    by_door: dict[str, PassedSocket] = {}
    for address in doors:
        key = door_key(address)
        found = next((s for s in passed if key is not None and s.key == key
                      and s not in by_door.values()), None)
        if found is not None:
            by_door[address] = found
    unused = tuple(s for s in passed if s not in by_door.values())
    unpassed = tuple(a for a in doors if a not in by_door) if passed else ()
    return Matching(by_door, unused, unpassed)
