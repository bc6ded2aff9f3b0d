"""In-process seams for the runner, the engine set and the child table: virtual time, stand-in
engine processes.

:func:`run_virtual` runs a coroutine on a :class:`VirtualClockLoop`: an ordinary selector event
loop whose ``time()`` is virtual. Whenever nothing is ready, the loop jumps straight to its next
timer instead of sleeping, so a 60 s start_timeout or a 10 s stop escalation passes in
microseconds, and every deadline is exact. Real file descriptors (the stand-ins' pipes) still
go through the real selector, polled without waiting.

:class:`StandInEngines` is the child table's spawner for such tests: each spawn is a
:class:`StandIn` (a pid, two pipes already at EOF) that follows a :class:`Script` -- exit by
itself after so many (virtual) seconds, die of the stop signal or ignore it -- and whose exits
are fed to the table's ``dispatch`` exactly as the reaper would.

:func:`engine_set` and :func:`views_of` build an engine set and its read-only views the way the
composition root does (its releases, its phase, a swap coordinator), without the daemon.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import selectors
import signal
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

from cuzkd.config import Config
from cuzkd.ratelimit import LimitedLog
from cuzkd.supervisor.core.phase import PhaseView, SupervisorPhase
from cuzkd.supervisor.engines.binaries import EngineBinaries
from cuzkd.supervisor.engines.engineset import EngineSet
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.proc.children import ChildProcess, ChildTable
from cuzkd.supervisor.web.readout import SupervisorViews
from cuzkd.swap.rolling import SwapCoordinator

T = TypeVar("T")


class _VirtualSelector(selectors.BaseSelector):
    """A real selector that never blocks while a timer is pending: it advances the clock."""

    def __init__(self, advance: Callable[[float], None]) -> None:
        self._inner = selectors.DefaultSelector()
        self._advance = advance

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only real I/O can move the test on
            return self._inner.select(None)
        self._advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual_now = 1000.0
        super().__init__(_VirtualSelector(self._advance))

    def _advance(self, seconds: float) -> None:
        self._virtual_now += seconds

    def time(self) -> float:
        return self._virtual_now

    def freeze(self, seconds: float) -> None:
        """The loop does not run for ``seconds`` (SIGSTOP, a VM pause), as from a callback
        that blocked: time jumps while nothing runs, and every timer due meanwhile fires late,
        at once, after it."""
        self._virtual_now += seconds


def run_virtual(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main()`` to its end on a fresh :class:`VirtualClockLoop`."""
    async def wrapped() -> T:
        return await main()

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(wrapped())


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

    def __call__(self, argv: Sequence[str], env: Mapping[str, str]) -> ChildProcess:
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
                     binaries=EngineBinaries(config.supervisor, config.state_dir),
                     phase=phase if phase is not None else running_phase(), clock=clock)


def views_of(group: EngineSet, table: ChildTable,
             phase: PhaseView | None = None) -> SupervisorViews:
    """``group``'s read-only views, with a swap coordinator over its state dir's releases."""
    config = group.config
    swaps = SwapCoordinator(EngineBinaries(config.supervisor, config.state_dir).store, group,
                            keep_releases=config.supervisor.keep_releases)
    return SupervisorViews(group, table, phase if phase is not None else running_phase(),
                           swaps, LimitedLog())
