"""Processes that outlive their engine: identified for certain, then stopped TERM → KILL.

An engine's helpers can leave its process group (``setsid``), be double-forked away from its
tree, or survive it when the engine runs behind a wrapper shell. The supervisor must stop them
without ever signalling an unrelated process that happens to reuse a pid, so a process is named
by its pid *and* its start time (``/proc/PID/stat`` field 22, clock ticks since boot): the pair
is unique for as long as the kernel runs. Before a signal the pair is checked again, through a
pidfd where the kernel has them (the check and the signal then refer to the same process even
if the pid is reused in between).

Descendants are attributed to an engine in two ways: the supervisor's tree walks (the engine's
live descendants, noted at every health poll), and the ``CUZKD_ENGINE`` variable every engine
gets in its environment, which its descendants inherit; that finds a helper double-forked out of
the tree (re-parented to the supervisor, a subreaper) before any walk saw it.

What reads ``/proc`` takes its root (``proc_root``, :mod:`cuzkd.procfs`), so the parsing is
tested on fixture trees; :func:`send` and :func:`stop` do not: they signal real processes, and
the identity checked before a signal must be the live kernel's.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cuzkd.procfs import PROC_ROOT
from cuzkd.supervisor.proc.tree import children, descendants

#: Environment variable naming the engine a process was started for (inherited by its
#: descendants).
ENGINE_ENV = "CUZKD_ENGINE"
#: After SIGKILL, how long to wait for the kernel to deliver the deaths.
KILL_SETTLE = 5.0
#: Period of the liveness checks while waiting for signalled processes to exit.
POLL = 0.02


@dataclass(frozen=True, order=True)
class Proc:
    """One process, for certain: pid plus start time in clock ticks since boot."""

    pid: int
    start: int


@dataclass(frozen=True)
class Stat:
    state: str
    ppid: int
    pgrp: int
    start: int


def stat(pid: int, *, proc_root: Path = PROC_ROOT) -> Stat | None:
    """The fields of ``/proc/PID/stat`` we use; None when the process is gone (or its line
    does not parse)."""
    try:
        raw = (proc_root / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after its last ')'
    fields = raw[raw.rfind(b")") + 2:].split()
    try:
        return Stat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def identify(pid: int, *, proc_root: Path = PROC_ROOT) -> Proc | None:
    """``pid`` as a :class:`Proc`, None when it is gone or already dead (a zombie)."""
    st = stat(pid, proc_root=proc_root)
    return None if st is None or st.state in ("Z", "X") else Proc(pid, st.start)


def alive(proc: Proc, *, proc_root: Path = PROC_ROOT) -> bool:
    """True while ``proc`` (that very process, not a pid reuse) runs and is not a zombie."""
    return identify(proc.pid, proc_root=proc_root) == proc


def boot_id(*, proc_root: Path = PROC_ROOT) -> str | None:
    """The kernel's boot id (start times are only comparable within one boot); None where
    ``/proc`` does not show it."""
    try:
        return (proc_root / "sys" / "kernel" / "random" / "boot_id").read_text().strip() or None
    except OSError:
        return None


def ancestors(*, proc_root: Path = PROC_ROOT) -> set[int]:
    """This process and its ancestors: never to be stopped as anybody's leftovers."""
    found: set[int] = set()
    pid = os.getpid()
    while pid > 0 and pid not in found:
        found.add(pid)
        st = stat(pid, proc_root=proc_root)
        pid = st.ppid if st is not None else 0
    return found


def engine_of(pid: int, *, proc_root: Path = PROC_ROOT) -> str | None:
    """The ``CUZKD_ENGINE`` a process was started with; None if unreadable or unset."""
    try:
        environ = (proc_root / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = f"{ENGINE_ENV}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None


def with_descendants(procs: Iterable[Proc], *, proc_root: Path = PROC_ROOT) -> set[Proc]:
    """``procs`` (those still alive) and every live descendant of theirs."""
    found: set[Proc] = set()
    for proc in procs:
        if alive(proc, proc_root=proc_root):
            found.add(proc)
            found.update(p for pid in descendants(proc.pid, proc_root=proc_root)
                         if (p := identify(pid, proc_root=proc_root)) is not None)
    return found


def adopted(known: Iterable[int], *, proc_root: Path = PROC_ROOT) -> dict[Proc, str | None]:
    """The supervisor's children that are not in ``known`` (its engines and one-shots):
    descendants re-parented to it, with the engine each was started for (None: unknown)."""
    skip = set(known)
    out: dict[Proc, str | None] = {}
    for pid in children(os.getpid(), proc_root=proc_root):
        if pid not in skip and (proc := identify(pid, proc_root=proc_root)) is not None:
            out[proc] = engine_of(pid, proc_root=proc_root)
    return out


def send(proc: Proc, signum: int) -> bool:
    """Signal ``proc`` if it is still that very process; False when it is gone."""
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfds here (or no descriptor left): check, then kill by pid
        fd = None
    try:
        if not alive(proc):  # gone, or the pid now names another process
            return False
        if fd is None:
            os.kill(proc.pid, signum)
        else:
            signal.pidfd_send_signal(fd, signum)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


async def stop(procs: Iterable[Proc], timeout: float, *, term: bool = True) -> list[Proc]:
    """SIGTERM every live one of ``procs``, SIGKILL those left after ``timeout``; returns the
    ones that were alive and signalled. Waits (at most ``timeout`` + KILL_SETTLE) until they
    are gone. ``term=False``: they already had their stop signal; wait, and return only those
    that needed the SIGKILL."""
    if term:
        signalled = sorted(p for p in set(procs) if send(p, signal.SIGTERM))
    else:
        signalled = sorted(p for p in set(procs) if alive(p))
    if await _gone(signalled, timeout):
        return signalled if term else []
    killed = [proc for proc in signalled if send(proc, signal.SIGKILL)]
    await _gone(signalled, KILL_SETTLE)
    return signalled if term else killed


async def _gone(procs: list[Proc], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in procs):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL)
    return True
