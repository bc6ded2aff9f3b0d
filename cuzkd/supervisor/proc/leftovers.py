"""What a previous supervisor's engines left running, recorded so the next one can end it.

``PR_SET_PDEATHSIG`` kills an engine's main process with a SIGKILLed supervisor, but not what
that process started: an engine behind a wrapper shell (``sh -c "cuzk ...; echo done"``) lives
on, keeps its port, and the next ``cuzkd run`` would restart-loop its own engine against it. So
each spawn is recorded in ``STATE_DIR/procs/ENGINE-PGID.json``: the process group, its leader's
start time, the kernel's boot id, and the descendants the supervisor has seen (pid + start
time). A record is removed once that process and everything it left are gone; at start-up every
record still there names a previous incarnation's engine, and what is left of it is stopped
before any engine starts.

Identity is checked before any signal (see :mod:`cuzkd.supervisor.proc.pids`):

- records from another boot are ignored (pids and start times mean nothing across a reboot);
- a recorded descendant must still have its recorded start time;
- a member of the recorded group must have started after the group's leader, and the leader's
  pid must not name a newer process: a pid cannot be reused while any process still has it as
  its group id, so while members are left the group is the recorded one. A member whose
  environment names another engine is never taken.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import structlog

from cuzkd.procfs import PROC_ROOT, listed_pids
from cuzkd.supervisor.proc import pids
from cuzkd.supervisor.proc.pids import Proc

log = structlog.get_logger("cuzkd.supervisor")


class GroupRecord(msgspec.Struct, frozen=True):
    engine: str
    boot_id: str
    pgid: int
    #: the group leader's (the spawned process's) start time, clock ticks since boot
    start: int
    #: descendants seen by the supervisor: [pid, start time] pairs
    known: list[tuple[int, int]] = msgspec.field(default_factory=list)


class Records:
    """The record files of one state dir (created 0700 like the state dir itself)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, engine: str, pgid: int) -> Path:
        return self.directory / f"{engine}-{pgid}.json"

    def save(self, record: GroupRecord) -> None:
        """Write atomically (a crash leaves the old record or the new one, never half)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._path(record.engine, record.pgid)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            os.write(fd, msgspec.json.encode(record))
        finally:
            os.close(fd)
        tmp.replace(path)

    def remove(self, engine: str, pgid: int) -> None:
        self._path(engine, pgid).unlink(missing_ok=True)

    def load(self) -> list[GroupRecord]:
        """Every readable record; unreadable ones are logged and skipped."""
        out = []
        for path in self._files("*.json"):
            try:
                out.append(msgspec.json.decode(path.read_bytes(), type=GroupRecord))
            except (OSError, msgspec.DecodeError) as exc:
                log.warning("leftover_record_unreadable", path=str(path), error=str(exc))
        return out

    def clear(self) -> None:
        """Remove every record (and half-written one): their processes were dealt with."""
        for path in self._files("*"):
            path.unlink(missing_ok=True)

    def _files(self, pattern: str) -> list[Path]:
        try:
            return sorted(p for p in self.directory.glob(pattern) if p.is_file())
        except OSError:
            return []


def leftovers(record: GroupRecord, boot_id: str, *, proc_root: Path = PROC_ROOT) -> set[Proc]:
    """The processes of ``record`` still running, by the identity rules above (never this
    process or one of its ancestors)."""
    if record.boot_id != boot_id:
        return set()
    found = {proc for pid, start in record.known
             if pids.alive(proc := Proc(pid, start), proc_root=proc_root)}
    leader = pids.stat(record.pgid, proc_root=proc_root)
    if leader is None or leader.start == record.start:
        found |= _group_members(record, proc_root)
    mine = pids.ancestors(proc_root=proc_root)
    return {p for p in pids.with_descendants(found, proc_root=proc_root) if p.pid not in mine}


def _group_members(record: GroupRecord, proc_root: Path) -> set[Proc]:
    members = set()
    for pid in listed_pids(proc_root):
        st = pids.stat(pid, proc_root=proc_root)
        if (st is not None and st.pgrp == record.pgid and st.start >= record.start
                and st.state not in ("Z", "X")
                and pids.engine_of(pid, proc_root=proc_root) in (None, record.engine)):
            members.add(Proc(pid, st.start))
    return members
