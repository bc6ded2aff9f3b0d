"""OOM-kill counters that tell a kernel OOM kill from any other SIGKILL.

``waitpid`` says only "killed by SIGKILL". The kernel counts OOM kills in two places the
supervisor can read without privileges: the memory cgroup of the process (cgroup v2
``memory.events`` ``oom_kill``, cgroup v1 ``memory.oom_control`` ``oom_kill``) and the whole
machine (``/proc/vmstat`` ``oom_kill``). :class:`OomCounters` snapshots both when an engine is
spawned (and refreshes the cgroup path on each health poll, since an engine may move itself
into another cgroup after exec); at its exit, a counter that grew confirms the OOM killer.

Best effort, documented in docs/supervisor.md: when engines share a cgroup (or only the
machine-wide counter is readable), an OOM kill of another process at about the same time as an
unrelated SIGKILL of this engine is blamed on the OOM killer too.
"""

from __future__ import annotations

from pathlib import Path

from cuzkd.procfs import PROC_ROOT

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _field(path: Path, name: str) -> int | None:
    """The integer after ``name`` in a ``key value`` per line file; None if unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return None


def memory_cgroup_events(pid: int, *, proc_root: Path = PROC_ROOT,
                         cgroup_root: Path = CGROUP_ROOT) -> Path | None:
    """The file counting OOM kills in ``pid``'s memory cgroup (v2 or v1), None if unknown."""
    try:
        lines = (proc_root / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "":  # cgroup v2 unified hierarchy
            candidate = cgroup_root / relative / "memory.events"
            if candidate.is_file():
                return candidate
        elif "memory" in controllers.split(","):
            candidate = cgroup_root / "memory" / relative / "memory.oom_control"
            if candidate.is_file():
                return candidate
    return None


class OomCounters:
    """OOM-kill counts covering one engine process: its memory cgroup and the machine."""

    def __init__(self, pid: int, *, proc_root: Path = PROC_ROOT,
                 cgroup_root: Path = CGROUP_ROOT) -> None:
        self._pid = pid
        self._proc_root = proc_root
        self._cgroup_root = cgroup_root
        self._vmstat = proc_root / "vmstat"
        self._cgroup: Path | None = None
        self._cgroup_start: int | None = None
        self._machine_start = _field(self._vmstat, "oom_kill")
        self.refresh()

    def refresh(self) -> None:
        """Follow the process into the memory cgroup it is in now (call while it lives)."""
        events = memory_cgroup_events(self._pid, proc_root=self._proc_root,
                                      cgroup_root=self._cgroup_root)
        if events is not None and events != self._cgroup:
            self._cgroup = events
            self._cgroup_start = _field(events, "oom_kill")

    def moved(self) -> bool:
        """True when the engine's memory cgroup counted an OOM kill since the snapshot (it
        counts global OOM kills of its processes too); the machine's counter decides only
        when the cgroup cannot be read (gone with the process, or never found)."""
        if self._cgroup is not None and self._cgroup_start is not None:
            now = _field(self._cgroup, "oom_kill")
            if now is not None:
                return now > self._cgroup_start
        machine = _field(self._vmstat, "oom_kill")
        return (machine is not None and self._machine_start is not None
                and machine > self._machine_start)
