"""Which files running processes execute, read from ``/proc/PID/exe``.

Pruning must not delete a release that a process still runs: an old engine that is slow to
exit, or a zombie's parent still holding it. Two signals are used because each fails somewhere:
the link text (``readlink``) is the path the kernel resolved at exec time, which overlay
filesystems can report differently from the path we stat; the link's target inode
(``stat``, as ``(st_dev, st_ino)``) identifies the file exactly, even when it was renamed.
A link text ending in `` (deleted)`` means that path now holds a different file (or none), so
it is never matched by path; its inode stays pinned by the process and cannot be reused, so
matching by inode remains exact.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cuzkd.procfs import PROC_ROOT, listed_pids

_DELETED_SUFFIX = " (deleted)"

FileKey = tuple[int, int]


@dataclass(frozen=True)
class FileIdentity:
    """A file on disk as :func:`executes` compares it: canonical path and inode."""

    realpath: str
    key: FileKey


@dataclass(frozen=True)
class Executable:
    """What one process executes."""

    pid: int
    path: str  # link text without the " (deleted)" marker
    deleted: bool
    key: FileKey | None  # None when the inode could not be stat'ed


def identify(path: Path) -> FileIdentity | None:
    """The identity of the file at ``path``, or None if it no longer exists."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return FileIdentity(os.path.realpath(path), (st.st_dev, st.st_ino))


def executable_of(pid: int, *, proc_root: Path = PROC_ROOT) -> Executable | None:
    """What ``pid`` executes, or None for kernel threads, zombies, vanished or hidden processes.

    Any OSError means "cannot tell for this process": scanning other people's processes must
    never make a swap fail.
    """
    link = proc_root / str(pid) / "exe"
    try:
        text = str(link.readlink())
    except OSError:
        return None
    try:
        st = link.stat()
        key: FileKey | None = (st.st_dev, st.st_ino)
    except OSError:
        key = None
    deleted = text.endswith(_DELETED_SUFFIX)
    return Executable(pid, text.removesuffix(_DELETED_SUFFIX) if deleted else text, deleted, key)


def running_executables(*, proc_root: Path = PROC_ROOT) -> Iterator[Executable]:
    """What every visible process executes."""
    for pid in listed_pids(proc_root):
        exe = executable_of(pid, proc_root=proc_root)
        if exe is not None:
            yield exe


def executes(exe: Executable, file: FileIdentity) -> bool:
    """Whether the process described by ``exe`` runs ``file`` (pure; see the module doc)."""
    if exe.key is not None and exe.key == file.key:
        return True
    return not exe.deleted and exe.path == file.realpath
