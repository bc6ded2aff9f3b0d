"""Resource usage of an engine's whole process tree, cheap enough for every scrape.

psutil's ``Process.children(recursive=True)`` builds a parent map by reading ``/proc/*/stat`` of
*every* process on the host; the supervisor did that once per engine per scrape, which was about
half of a busy scrape's CPU with 8 engines (docs/benchmarks.md, section *metrics*). The kernel
lists each thread's direct children in ``/proc/PID/task/TID/children``: walking those from the
engine down reads a handful of files instead of the whole process table. Without that file
(kernels built without CONFIG_PROC_CHILDREN) psutil's walk is used.

The children file may miss a child forked at the very moment it is read; for RSS and CPU totals
sampled at every scrape that is harmless.

The children-file walk takes its ``/proc`` root (``proc_root``, :mod:`cuzkd.procfs`) so it
is tested on fixture trees. psutil -- the fallback walk and :func:`tree_usage`'s RSS and CPU --
keeps its own root, ``psutil.PROCFS_PATH``, left at ``/proc``: it is a module global, and
rebinding it per call would change it for every thread at once (the scrape runs on one). A
fixture tree therefore always has the children files, so the fallback is never reached.
"""

from __future__ import annotations

from pathlib import Path

import psutil

from cuzkd.procfs import PROC_ROOT


def _children(pid: int, proc_root: Path) -> list[int] | None:
    """Direct children of every thread of ``pid``; None when the kernel has no children file."""
    try:
        tasks = list((proc_root / str(pid) / "task").iterdir())
    except OSError:
        return []  # gone
    kids: list[int] = []
    for task in tasks:
        try:
            kids.extend(int(k) for k in (task / "children").read_bytes().split())
        except FileNotFoundError:
            if not task.exists():
                continue  # the thread exited meanwhile
            return None
        except OSError:
            continue
    return kids


def children(pid: int, *, proc_root: Path = PROC_ROOT) -> list[int]:
    """Pids of ``pid``'s direct children."""
    kids = _children(pid, proc_root)
    if kids is not None:
        return kids
    try:
        return [p.pid for p in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def descendants(pid: int, *, proc_root: Path = PROC_ROOT) -> list[int]:
    """Pids of ``pid``'s descendants (children, grandchildren, ...), in no particular order."""
    found: list[int] = []
    stack = [pid]
    while stack:
        kids = _children(stack.pop(), proc_root)
        if kids is None:
            try:
                return [p.pid for p in psutil.Process(pid).children(recursive=True)]
            except psutil.Error:
                return []
        found.extend(kids)
        stack.extend(kids)
    return found


def tree_usage(pid: int) -> tuple[int | None, float | None]:
    """Resident bytes and CPU seconds summed over ``pid`` and its descendants (None if gone)."""
    rss, cpu = 0, 0.0
    for member in (pid, *descendants(pid)):
        try:
            proc = psutil.Process(member)
            with proc.oneshot():
                rss += proc.memory_info().rss
                times = proc.cpu_times()
        except psutil.Error:
            if member == pid:
                return None, None
            continue
        cpu += times.user + times.system
    return rss, cpu
