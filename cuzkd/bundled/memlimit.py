"""How much memory this process may use: physical RAM, or less where a cgroup limits it.

``memory_budget = "auto"`` sizes the budget from this. In a container (or a systemd unit with
``MemoryMax=``) physical RAM is the wrong answer: a budget above the cgroup's limit lets the
engine admit work the kernel's OOM killer then ends. Both cgroup versions are read: v2's
``memory.max`` and v1's ``memory.limit_in_bytes``, for the process's own cgroup and every
ancestor up to the hierarchy's root (a parent's limit binds its children too); the lowest
wins. The paths are parameters so tests can point them at fixture files.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import psutil

from cuzkd.procfs import PROC_ROOT

PROC_CGROUP = PROC_ROOT / "self" / "cgroup"
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_memory_limit(proc_cgroup: Path = PROC_CGROUP,
                        root: Path = CGROUP_ROOT) -> int | None:
    """The lowest memory limit on this process's cgroups in bytes; None when there is none."""
    try:
        membership = proc_cgroup.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    limits: list[int] = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # v2: "0::/system.slice/x.service"
            limits += _chain(root, path, "memory.max")
        elif "memory" in controllers.split(","):  # v1: "4:memory:/docker/abc"
            limits += _chain(root / "memory", path, "memory.limit_in_bytes")
    return min(limits, default=None)


def _chain(base: Path, path: str, name: str) -> list[int]:
    """Limits in ``name`` of the cgroup at ``path`` and each ancestor under ``base``.

    Inside a container the mount shows the container's own cgroup as its root while
    /proc/self/cgroup may still name the full path; walking up reaches the mount's root then.
    """
    parts = PurePosixPath(path).parts[1:] if path.startswith("/") else ()
    found = []
    for depth in range(len(parts), -1, -1):
        limit = _read_limit(base.joinpath(*parts[:depth]) / name)
        if limit is not None:
            found.append(limit)
    return found


def _read_limit(path: Path) -> int | None:
    try:
        raw = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None  # v2 writes "max" for no limit


def usable_memory_bytes(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> int:
    """Physical RAM, capped by the cgroup memory limit when there is one."""
    physical = int(psutil.virtual_memory().total)
    limit = cgroup_memory_limit(proc_cgroup, root)
    return physical if limit is None else min(physical, limit)
