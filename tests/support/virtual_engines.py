"""Stand-in engine processes for in-process tests of the runner and the engine set.

:class:`StandInEngines` is the child table's spawner for such tests: each spawn is a
:class:`StandIn` (a pid, two pipes already at EOF) that follows a :class:`Script` -- exit by
itself after so many (virtual) seconds, die of the stop signal or ignore it -- and whose exits
are fed to the table's ``dispatch`` exactly as the reaper would. Run them on the virtual clock
(:mod:`support.virtual_clock`): their scripts are timers.

:func:`engine_set` and :func:`readout_of` build an engine set and its read-only views the way the
composition root does (its releases, its phase, a swap coordinator), without the daemon.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import signal
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from cuzkd.config import Config, parse_config, state_dir
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.states import State
from cuzkd.supervisor.core.phase import PhaseView, SupervisorPhase
from cuzkd.supervisor.engines.binaries import EngineBinaries
from cuzkd.supervisor.engines.engineset import EngineSet
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.engines.runner import EngineRunner
from cuzkd.supervisor.proc.children import ChildProcess, ChildTable
from cuzkd.supervisor.web.readout import SupervisorReadout
from cuzkd.swap.rolling import SwapCoordinator


def exited(code: int) -> int:
    """The wait status of an exit with ``code``."""
    return code << 8


@dataclass(frozen=True)
class Script:
    """How one spawned stand-in behaves."""

    #: exits by itself after this many seconds (None: runs until a signal ends it)
    runs_for: float | None = None
    #: the wait status of that exit
    status: int = exited(1)
    #: the stop signal does nothing (only SIGKILL ends it)
    ignores_stop: bool = False


@dataclass
class StandIn:
    """One spawned engine that is only a pid and two pipes at EOF."""

    pid: int
    argv: list[str]
    env: dict[str, str]
    script: Script
    spawned_at: float
    owner: StandInEngines
    stdout: IO[bytes] = field(init=False)
    stderr: IO[bytes] = field(init=False)
    signals: list[tuple[float, int]] = field(default_factory=list)
    wait_status: int | None = None
    alive: bool = True

    def __post_init__(self) -> None:
        self.stdout, self.stderr = _eof_pipe(), _eof_pipe()

    def reaped(self, wait_status: int) -> None:
        self.wait_status = wait_status

    def signal_group(self, signum: int) -> bool:
        if not self.alive:
            return False
        loop = asyncio.get_running_loop()
        self.signals.append((loop.time(), signum))
        if signum == signal.SIGKILL or not self.script.ignores_stop:
            loop.call_soon(self.owner.end, self, signum)  # killed by the signal
        return True


def _eof_pipe() -> IO[bytes]:
    read, write = os.pipe()
    os.close(write)
    return open(read, "rb", buffering=0)


class StandInEngines:
    """The spawner: each spawn takes the next :class:`Script` (the last one repeats)."""

    def __init__(self, *scripts: Script) -> None:
        self._scripts = list(scripts) or [Script()]
        self._pids: Iterator[int] = itertools.count(10_000_001)  # above any real pid_max
        self.table = ChildTable(self)
        self.spawned: list[StandIn] = []
        #: errors the next spawns raise, in order (then they succeed again)
        self.failures: list[OSError] = []
        self.spawn_event = asyncio.Event()

    def __call__(self, argv: Sequence[str], env: Mapping[str, str],
                 pass_fds: Sequence[int] = ()) -> ChildProcess:
        if self.failures:
            raise self.failures.pop(0)
        loop = asyncio.get_running_loop()
        script = self._scripts[min(len(self.spawned), len(self._scripts) - 1)]
        proc = StandIn(next(self._pids), list(argv), dict(env), script, loop.time(), self)
        self.spawned.append(proc)
        if script.runs_for is not None:
            loop.call_later(script.runs_for, self.end, proc, script.status)
        self.spawn_event.set()
        self.spawn_event = asyncio.Event()
        return proc

    def end(self, proc: StandIn, wait_status: int) -> None:
        """The stand-in exits with ``wait_status``; the table hears of it like from the reaper."""
        if proc.alive:
            proc.alive = False
            self.table.dispatch(proc.pid, wait_status)

    async def next_spawn(self) -> StandIn:
        """Wait for the next spawn (a state-transition event, never a sleep)."""
        count = len(self.spawned)
        while len(self.spawned) == count:
            await self.spawn_event.wait()
        return self.spawned[-1]


def no_such_file() -> OSError:
    return FileNotFoundError(errno.ENOENT, "No such file or directory")


def too_many_files() -> OSError:
    return OSError(errno.EMFILE, "Too many open files")


def config_of(tmp_path: Path, *engines: dict[str, Any]) -> Config:
    """A config whose engines (given by their keys) run stand-ins, state under ``tmp_path``."""
    raw = {"supervisor": {"state_dir": str(tmp_path / "state")},
           "engine": [{"command": ["stand-in"], **keys} for keys in engines]}
    return parse_config(raw, "test")


async def in_state(runner: EngineRunner, state: State) -> None:
    """Wait for ``runner`` to reach ``state`` (a transition, never a time)."""
    assert await runner.wait_for(lambda: runner.state is state)


def running_phase() -> SupervisorPhase:
    """The supervisor's phase once it started (reloads allowed, engines may start)."""
    phase = SupervisorPhase(started_at=0.0)
    phase.started()
    return phase


def engine_set(config: Config, table: ChildTable, *, phase: PhaseView | None = None,
               clock: RunClock | None = None) -> EngineSet:
    """An engine set as the composition root builds it: the releases in ``config``'s state
    dir, ``phase`` (a :func:`running_phase` unless given)."""
    return EngineSet(config, table,
                     binaries=EngineBinaries(config.supervisor, state_dir(config)),
                     phase=phase if phase is not None else running_phase(), clock=clock)


def readout_of(group: EngineSet, table: ChildTable,
             phase: PhaseView | None = None) -> SupervisorReadout:
    """``group``'s read-only views, with a swap coordinator over its state dir's releases."""
    config = group.config
    swaps = SwapCoordinator(EngineBinaries(config.supervisor, state_dir(config)).store, group,
                            keep_releases=config.supervisor.keep_releases)
    return SupervisorReadout(group, table, phase if phase is not None else running_phase(),
                           swaps, LimitedLog())
