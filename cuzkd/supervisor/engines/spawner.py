"""Spawning one engine's processes: the spawn gate's wait, the spawn, its output readers.

:func:`~cuzkd.supervisor.core.spawngate.spawn_gate` decides whether a spawn waits (for the
previous process's leftovers, for GPU memory); this carries the wait out and makes the spawn:
the command, environment and status socket of its
:class:`~cuzkd.supervisor.engines.launch.EngineLaunch`, the child table's spawn, the readers of
its stdout and stderr. Separate from the runner because it is all about getting a process
going, while the runner decides what happens to one once it runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from structlog.typing import FilteringBoundLogger

from cuzkd.errors import SpawnError
from cuzkd.log.ratelimit import LimitedLog, errno_name
from cuzkd.supervisor.core.handover import Child
from cuzkd.supervisor.core.spawngate import SpawnGate, spawn_gate
from cuzkd.supervisor.engines.launch import EngineLaunch
from cuzkd.supervisor.engines.spawnrecord import SpawnRecord
from cuzkd.supervisor.engines.stderrtail import StderrTail
from cuzkd.supervisor.proc.adopted import AdoptedProcess
from cuzkd.supervisor.proc.children import SPAWN_ERRORS, ChildProcess, ChildTable
from cuzkd.supervisor.proc.descendants import DescendantWatch
from cuzkd.supervisor.proc.oom import OomCounters
from cuzkd.supervisor.proc.output import OutputLog, log_lines
from cuzkd.supervisor.proc.spawn import spawn_error_is_transient
from cuzkd.supervisor.tasks import TaskSet


@dataclass(frozen=True)
class SpawnFailed:
    """The spawn raised: ``error`` says why; ``transient``: descriptors or memory were short
    for a moment (worth a retry)."""

    error: str
    transient: bool


class EngineSpawner:
    """Spawns one engine's processes through the child table, waiting at the spawn gate."""

    def __init__(self, launch: EngineLaunch, children: ChildTable, *,
                 descendants: DescendantWatch, output: OutputLog, tasks: TaskSet,
                 on_exit: Callable[[int], None], log: FilteringBoundLogger,
                 limited: LimitedLog) -> None:
        """``on_exit``: told the wait status when the reaper collects a process; ``tasks``:
        the runner's, which owns the gate's wait and the output readers."""
        self._launch = launch
        self._children = children
        self._descendants = descendants
        self._output = output
        self._tasks = tasks
        self._on_exit = on_exit
        self._log = log
        self._limited = limited
        #: the current process's last stderr lines; the dead one's, once it exited
        self.stderr = StderrTail()
        #: processes spawned so far
        self.spawns = 0
        #: the spawn waiting for leftovers or GPU memory, if any
        self._gate: asyncio.Task[None] | None = None

    @property
    def argv(self) -> list[str]:
        """The command as configured (``{binary}`` unresolved)."""
        return self._launch.argv

    @property
    def waiting(self) -> bool:
        """A spawn waits at the gate (leftovers, GPU memory)."""
        return self._gate is not None

    @property
    def waiting_for_gpu(self) -> bool:
        return self._gate is not None and self._launch.gated

    def gate(self) -> SpawnGate:
        """What a spawn asked for now does."""
        return spawn_gate(waiting=self._gate is not None,
                          leftovers_stopping=bool(self._descendants.sweeping),
                          gpu_gated=self._launch.gated)

    def wait_then(self, spawn: Callable[[], None]) -> None:
        """Wait at the gate, then ``spawn``."""
        self._gate = self._tasks.start(self._wait_then(spawn))

    async def _wait_then(self, spawn: Callable[[], None]) -> None:
        """Spawn once the previous process's leftovers are gone -- a helper that ignored
        SIGTERM holds its port or GPU memory until killed (``stop_timeout`` bounds it) -- and,
        for an engine pinned to GPUs, once they hold nothing of the previous process and have
        ``gpu_memory_needed`` free, or after ``gpu_release_timeout`` (then say why)."""
        if self._descendants.sweeping:
            self._log.info("engine_spawn_waiting",
                           pids=sorted(p.pid for p in self._descendants.sweeping))
            await self._descendants.wait_swept()
        await self._launch.wait_for_gpus(self._log)
        self._gate = None
        spawn()

    def abandon(self) -> bool:
        """Drop the spawn waiting at the gate (a stop came first); False when none waits."""
        if self._gate is None:
            return False
        self._gate.cancel()
        self._gate = None
        self._log.info("gpu_gate_abandoned" if self._launch.gated
                       else "engine_spawn_abandoned", reason="stop requested")
        return True

    def spawn(self) -> SpawnRecord | SpawnFailed:
        """Spawn a process now, its output read under the engine's logger."""
        try:
            argv = self._launch.command()
            self._launch.prepare()
            child = self._children.spawn(argv, self._launch.environment(), self._on_exit)
        except (*SPAWN_ERRORS, SpawnError) as exc:
            # ValueError: execve's argument rules (NUL bytes); raised, it would escape the reaper.
            transient = spawn_error_is_transient(exc)
            self._limited.log(self._log, "error", "engine_spawn_failed", key=errno_name(exc),
                              error=str(exc), errno=errno_name(exc), transient=transient,
                              argv=self.argv)
            return SpawnFailed(str(exc), transient)
        self.spawns += 1
        self._log.info("engine_spawned", pid=child.pid, argv=argv)
        return self._watch(child, time.time())

    def adopt(self, handed: Child, started_at: float) -> SpawnRecord:
        """Take over the process the old code spawned (``cuzkd upgrade``): registered with
        the child table before its reaper runs, its output read again."""
        child = AdoptedProcess(handed.pid, handed.stdout, handed.stderr)
        self._children.adopt(child, self._on_exit)
        return self._watch(child, started_at)

    def _watch(self, child: ChildProcess, started_at: float) -> SpawnRecord:
        """Its descendants recorded, its output read under the engine's logger."""
        self._descendants.spawned(child.pid)
        self._tasks.start(log_lines(child.stdout, self._output, "stdout", child.pid))
        self.stderr.read_by(self._tasks.start(log_lines(
            child.stderr, self._output, "stderr", child.pid, tail=self.stderr.spawned())))
        return SpawnRecord(child, started_at=started_at, oom=OomCounters(child.pid))

    def process_ended(self, pids_of_it: set[int]) -> None:
        """A process exited: ``pids_of_it`` (it, its descendants) hold nothing of the GPUs the
        next spawn waits for."""
        self._launch.previous_process_ended(pids_of_it)
