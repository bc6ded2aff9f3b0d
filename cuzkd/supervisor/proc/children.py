"""The child table: the one owner of the supervisor's children and of what their exits mean.

Every child of the supervisor is an engine process (its runner waits for the exit), a one-shot
command (a swap's smoke test: :meth:`ChildTable.run_oneshot` waits for it), or a descendant
re-parented to us as child subreaper or PID 1. The table maps each pid it spawned to the
callback its exit goes to, owns the single reaper (SIGCHLD → ``waitpid(-1)``) and dispatches
every collected exit: to that callback, or counted in :attr:`ChildTable.zombies_reaped`.

**Spawn-then-register, the one invariant.** :meth:`ChildTable.spawn` registers the pid in the
same synchronous step that forked it -- no ``await`` between the two. The reaper runs on this
event loop, so it cannot collect a child before its owner is known; with an ``await`` in between,
a child exiting at once would be reaped as an unknown zombie and its owner would wait for an
exit already consumed. Nothing else in the supervisor spawns a process or registers a pid.

The spawner is a seam: tests give the table one that returns stand-in processes, and feed exits
through :meth:`ChildTable.dispatch` as the reaper would.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import IO, Protocol

import structlog

from cuzkd.supervisor.proc.output import OutputLog, log_lines
from cuzkd.supervisor.proc.reaper import Reaper
from cuzkd.supervisor.proc.spawn import EngineProcess, exit_cause

log = structlog.get_logger("cuzkd.supervisor")

#: After a one-shot process exited, how long its output may still drain (a leftover that
#: escaped its process group could hold the pipes open forever).
ONESHOT_DRAIN = 2.0


class ChildProcess(Protocol):
    """A spawned child as the supervisor uses it (:class:`EngineProcess` in production)."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> IO[bytes]: ...

    @property
    def stderr(self) -> IO[bytes]: ...

    def reaped(self, wait_status: int) -> None: ...

    def signal_group(self, signum: int) -> bool: ...


class Spawner(Protocol):
    """Forks and execs ``argv`` with exactly ``env`` (and the descriptors ``pass_fds`` open
    under their numbers); raises OSError, ValueError (a NUL byte, an empty command) or
    SubprocessError when it cannot. Called on the main thread only: the real one
    (:class:`EngineProcess`) refuses any other, PDEATHSIG being tied to the forking thread."""

    def __call__(self, argv: Sequence[str], env: Mapping[str, str],
                 pass_fds: Sequence[int] = ()) -> ChildProcess: ...

#: What a child's exit is handed to: its raw wait status.
OnExit = Callable[[int], None]

#: What :meth:`ChildTable.spawn` lets through from the spawner (anything else is a bug).
SPAWN_ERRORS = (OSError, ValueError, subprocess.SubprocessError)


class ChildTable:
    def __init__(self, spawner: Spawner = EngineProcess) -> None:
        self._spawner = spawner
        self._children: dict[int, tuple[ChildProcess, OnExit]] = {}
        self._reaper = Reaper(self.dispatch)
        #: exits of children nobody spawned here: adopted orphans (``cuzkd_zombies_reaped_total``)
        self.zombies_reaped = 0

    # -- the reaper ------------------------------------------------------------------------

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Handle SIGCHLD on ``loop`` (and collect what exited before)."""
        self._reaper.install(loop)

    def uninstall(self) -> None:
        self._reaper.uninstall()

    def reap(self) -> None:
        """Collect every child that has exited now (the shutdown's last sweep)."""
        self._reaper.reap()

    def dispatch(self, pid: int, wait_status: int) -> bool:
        """A child was collected: hand its exit to its owner; False (counted) if it had none."""
        entry = self._children.pop(pid, None)
        if entry is None:
            self.zombies_reaped += 1
            log.debug("zombie_reaped", pid=pid, status=os.waitstatus_to_exitcode(wait_status))
            return False
        proc, on_exit = entry
        proc.reaped(wait_status)
        on_exit(wait_status)
        return True

    # -- spawning --------------------------------------------------------------------------

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], on_exit: OnExit,
              pass_fds: Sequence[int] = ()) -> ChildProcess:
        """Spawn ``argv`` and register it, ``on_exit`` to receive its wait status; the child
        inherits ``pass_fds`` (the door process's sockets), and no other descriptor.

        Synchronous on purpose: see the module's invariant. Raises what the spawner raises
        (:data:`SPAWN_ERRORS`); nothing is registered then.
        """
        proc = self._spawner(argv, env, pass_fds)
        self._children[proc.pid] = (proc, on_exit)
        return proc

    def adopt(self, proc: ChildProcess, on_exit: OnExit) -> None:
        """Register a child the old code spawned (``cuzkd upgrade``), ``on_exit`` to receive
        its wait status: before :meth:`install`, so an exit during the exec is its owner's."""
        self._children[proc.pid] = (proc, on_exit)

    def pids(self) -> Collection[int]:
        """The pids of the registered children (engines and one-shots still running)."""
        return self._children.keys()

    async def run_oneshot(self, argv: Sequence[str], timeout: float,
                          env: Mapping[str, str] | None = None,
                          pass_fds: Sequence[int] = ()) -> str:
        """Run ``argv`` to its end (a smoke test, a canary check, an upgrade's dry run); its
        exit cause, or ``timeout``. ``env``: its environment (default: ours); ``pass_fds``:
        descriptors it inherits.

        Spawned like an engine (own process group, die with us) and collected by our reaper:
        ``subprocess.run`` or asyncio's child watcher would race the reaper's ``waitpid(-1)``
        for the status. On timeout the whole group is killed. Output goes to the log.
        """
        exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_exit(wait_status: int) -> None:
            if not exited.done():
                exited.set_result(wait_status)

        try:
            proc = self.spawn(argv, os.environ if env is None else env, on_exit, pass_fds)
        except SPAWN_ERRORS as exc:
            log.error("oneshot_spawn_failed", argv=list(argv), error=str(exc))
            return f"spawn_failed ({exc})"
        oneshot_log = log.bind(oneshot=argv[0])
        output = OutputLog(lines=structlog.get_logger("cuzkd.engine").bind(oneshot=argv[0]),
                           notes=oneshot_log)
        readers = [asyncio.create_task(log_lines(pipe, output, stream, proc.pid))
                   for pipe, stream in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
        oneshot_log.info("oneshot_spawned", pid=proc.pid, argv=list(argv))
        try:
            try:
                cause = exit_cause(await asyncio.wait_for(asyncio.shield(exited), timeout))[0]
            except TimeoutError:
                oneshot_log.warning("oneshot_killed", pid=proc.pid, reason=f"{timeout:g}s elapsed")
                proc.signal_group(signal.SIGKILL)
                await exited
                cause = "timeout"
        except BaseException:  # cancelled: kill it all, and do not wait for output
            proc.signal_group(signal.SIGKILL)
            for reader in readers:
                reader.cancel()
            raise
        proc.signal_group(signal.SIGKILL)  # leftovers of its group
        _, pending = await asyncio.wait(readers, timeout=ONESHOT_DRAIN)
        for reader in pending:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        oneshot_log.info("oneshot_exited", pid=proc.pid, cause=cause)
        return cause
