"""One engine's descendants: remembered while its process runs, stopped once it has exited.

An engine's helpers (a double-forked cache warmer, a process that called ``setsid``, a child
that ignores SIGTERM) can outlive it, holding its port or GPU memory from its replacement.
So while the process runs, the runner's health loop has this watch note its live descendants:
those the tree walk finds and those the supervisor adopted as subreaper with the engine's
``CUZKD_ENGINE`` mark. They are kept in memory and in the state dir record of the process
(:mod:`.leftovers`), so a supervisor that dies does not lose them either. When the process
exits, what is left of them is stopped -- TERM, then KILL after ``stop_timeout`` -- and
counted in ``cuzkd_engine_descendants_killed_total``. A replacement waits for that
(:meth:`DescendantWatch.wait_swept`).
"""

from __future__ import annotations

import signal
from pathlib import Path

import msgspec
from structlog.typing import FilteringBoundLogger

from cuzkd.log.ratelimit import LimitedLog, errno_name
from cuzkd.supervisor.proc import pids
from cuzkd.supervisor.proc.children import ChildTable
from cuzkd.supervisor.proc.leftovers import GroupRecord, Records
from cuzkd.supervisor.proc.pids import Proc
from cuzkd.supervisor.proc.tree import descendants
from cuzkd.supervisor.tasks import TaskSet


class DescendantWatch:
    def __init__(self, engine: str, records_dir: Path, stop_timeout: float,
                 children: ChildTable, log: FilteringBoundLogger,
                 limited: LimitedLog) -> None:
        self._engine = engine
        self._stop_timeout = stop_timeout
        self._children = children
        self._log = log
        self._limited = limited
        #: live descendants of the current process seen so far
        self._known: set[Proc] = set()
        #: descendants of exited processes being stopped now, and the tasks stopping them
        self._sweeping: set[Proc] = set()
        self._sweeps = TaskSet()
        #: descendants that had to be stopped (a previous supervisor's included, see engines)
        self.killed = 0
        #: the state dir's record of the current process
        self._records = Records(records_dir)
        self._record: GroupRecord | None = None
        self._boot_id = pids.boot_id()

    @property
    def sweeping(self) -> frozenset[Proc]:
        """Leftovers of exited processes still being stopped."""
        return frozenset(self._sweeping)

    def known_pids(self) -> set[int]:
        return {p.pid for p in self._known}

    def spawned(self, pid: int) -> None:
        """A new process: its record, without which no later supervisor could end its
        leftovers (none without a kernel boot id, which is what makes a record trustworthy)."""
        if self._boot_id is None:
            return
        st = pids.stat(pid)  # a zombie at worst: the reaper runs on this loop, after us
        self._record = None if st is None else GroupRecord(self._engine, self._boot_id, pid,
                                                           st.start)
        self._save_record(pid, set())

    def note(self, pid: int, *, walk: bool) -> None:
        """Remember the live descendants of the running process ``pid``: its adopted children
        (cheap, read at every poll) and, when ``walk``, its process tree (one file per engine
        thread, so at the cadence's pace)."""
        seen = self._adopted()
        if walk:
            seen |= {p for p in map(pids.identify, descendants(pid)) if p is not None}
        if not seen <= self._known:
            self._known = {p for p in self._known if pids.alive(p)} | seen
            self._save_record(pid, self._known)

    def take_leftovers(self, pgid: int) -> set[Proc]:
        """What the exited process ``pgid`` left alive: its descendants seen so far and the
        adopted children started for this engine, with their own descendants. The record
        keeps them until they are stopped (or goes, when there are none)."""
        found = pids.with_descendants([*self._known, *self._adopted()]) - self._sweeping
        self._known = set()
        if found:
            self._save_record(pgid, found)
        else:
            self._remove_record(pgid)
        return found

    def stop(self, leftovers: set[Proc], pgid: int | None = None, *,
             signalled: bool = False) -> None:
        """Stop ``leftovers`` (TERM, KILL after stop_timeout) in a task of this watch; counted
        in :attr:`killed`. ``pgid``: the record to remove once they are gone. ``signalled``:
        they had the stop signal already (only a SIGKILL they need counts)."""
        self._sweeping |= leftovers
        self._sweeps.start(self._stop(leftovers, pgid, signalled))

    def kill_now(self) -> None:
        """SIGKILL the leftovers being stopped (a hurried shutdown)."""
        for proc in self._sweeping:
            pids.send(proc, signal.SIGKILL)

    async def wait_swept(self) -> None:
        """Return once the leftovers of every exited process are gone (stop_timeout bounds it)."""
        await self._sweeps.wait()

    async def close(self) -> None:
        """See the stops in progress to their end (stop_timeout bounds them): leftovers of an
        engine removed by a reload must not be left running."""
        await self.wait_swept()
        await self._sweeps.cancel_all()  # none left, unless close() itself was cancelled

    def _adopted(self) -> set[Proc]:
        """The supervisor's adopted children started for this engine (double-forked helpers),
        except those of earlier processes already being stopped."""
        return {p for p, engine in pids.adopted(self._children.pids()).items()
                if engine == self._engine} - self._sweeping

    async def _stop(self, leftovers: set[Proc], pgid: int | None, signalled: bool) -> None:
        self._log.warning("engine_descendants_stopping", pids=sorted(p.pid for p in leftovers),
                          timeout=self._stop_timeout, signalled=signalled)
        try:
            stopped = await pids.stop(leftovers, self._stop_timeout, term=not signalled)
        finally:
            self._sweeping -= leftovers
        if pgid is not None:
            self._remove_record(pgid)
        self.killed += len(stopped)
        self._log.warning("engine_descendants_stopped", pids=[p.pid for p in stopped],
                          count=len(stopped), left=[p.pid for p in stopped if pids.alive(p)])

    def _save_record(self, pgid: int, known: set[Proc]) -> None:
        if self._record is None or self._record.pgid != pgid:
            return
        self._record = msgspec.structs.replace(self._record,
                                               known=[(p.pid, p.start) for p in sorted(known)])
        try:
            self._records.save(self._record)
        except OSError as exc:
            self._record_failed(exc)

    def _remove_record(self, pgid: int) -> None:
        try:
            self._records.remove(self._engine, pgid)
        except OSError as exc:
            self._record_failed(exc)

    def _record_failed(self, exc: OSError) -> None:
        self._limited.log(self._log, "warning", "leftover_record_failed", key=errno_name(exc),
                          error=str(exc))
