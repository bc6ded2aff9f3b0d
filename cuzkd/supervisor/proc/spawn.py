"""Spawning engine processes and signalling their process groups.

Each engine gets its own session (so its whole tree is one process group we can SIGKILL),
stdin from /dev/null, pipes for stdout/stderr, no other descriptor, and
``PR_SET_PDEATHSIG=SIGKILL`` so no engine outlives a supervisor that was itself SIGKILLed. The
environment is passed in whole.

We use :class:`subprocess.Popen` only for its fork/exec, never for waiting: the supervisor's
single reaper (:mod:`cuzkd.supervisor.proc.reaper`) collects every child with ``waitpid(-1)``, and
hands the exit status back through :meth:`EngineProcess.reaped`, which stores it on the Popen
object so Popen never waits for (or, in ``__del__``, keeps polling) a pid that may have been
reused.

Popen runs the exec shim (:mod:`cuzkd.supervisor.proc.execshim`), never a ``preexec_fn``: Python
code between fork and exec can deadlock the child while other threads run. The shim arms
PDEATHSIG and execs the engine in place; how its exec went comes back through a report pipe
read right after Popen, so a failed exec (ENOENT, EACCES, ENOEXEC, E2BIG, ETXTBSY, ...) still
raises OSError from the spawn with the errno and file name Popen itself would give, and the
runner's transient/permanent decision (:func:`spawn_error_is_transient`) is unchanged. The
price is the shim's interpreter start-up (~20 ms) on the event loop at each spawn.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from cuzkd.supervisor.core.exitcause import process_cause
from cuzkd.supervisor.proc import execshim
from cuzkd.supervisor.proc.reaper import ended

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_CHILD_SUBREAPER = 36

#: The interpreter that runs the shim: this one, bare (``-I -S``: no site, no environment
#: variables of its own, only the standard library); the source is the running version's.
_SHIM = (sys.executable, "-I", "-S", "-c",
         Path(execshim.__file__).read_text(encoding="utf-8"))
#: How much of a shim's stderr is read for the error when it did not run (a Python fatal error).
_STDERR_KEPT = 8192


#: Spawn errors that pass by themselves: descriptors, processes or memory short for a moment
#: (``ulimit -n`` reached under a connection flood), a binary still being written (ETXTBSY), a
#: full disk for the socket directory. Retried through the backoff; every other error
#: (ENOENT, EACCES, ENOEXEC, a NUL byte in argv, no release for ``{binary}``) needs an operator.
TRANSIENT_SPAWN_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM,
                                    errno.ETXTBSY, errno.ENOSPC})


def spawn_error_is_transient(exc: BaseException) -> bool:
    """True when a spawn that raised ``exc`` may succeed if simply tried again later."""
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_SPAWN_ERRNOS


def set_child_subreaper() -> bool:
    """Adopt orphaned descendants (double-forked grandchildren); False if refused."""
    return bool(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def _check_forking_thread() -> None:
    """PDEATHSIG fires when the thread that forked the child exits, not the process: an
    engine spawned from a worker thread (``asyncio.to_thread``) would be SIGKILLed when that
    thread ends. Only the main thread lives as long as the supervisor."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("engines are spawned on the main thread only: PR_SET_PDEATHSIG "
                           f"would tie them to thread {threading.current_thread().name!r}")


def _above_stdio(fd: int) -> int:
    """``fd``, moved to 3 or above if it is not (a supervisor started with stdin closed):
    in the child Popen puts /dev/null and the output pipes on 0-2, over what was there."""
    if fd > 2:
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def memfd_holding(data: bytes, name: str = "cuzkd-spawn-spec") -> int:
    """A close-on-exec memfd holding ``data``, positioned at its start: filled before the
    fork, it lets the shim read a spec of any size without the parent waiting on a pipe."""
    fd = _above_stdio(os.memfd_create(name))
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _report_pipe() -> tuple[int, int]:
    """The report pipe, close-on-exec at both ends; its write end (the shim's) above stdio."""
    report_r, report_w = os.pipe()
    try:
        return report_r, _above_stdio(report_w)
    except BaseException:
        os.close(report_r)
        raise


def _start_shim(argv: Sequence[str], env: Mapping[str, str], pass_fds: Sequence[int]
                ) -> tuple[subprocess.Popen[bytes], int]:
    """Popen of the shim for ``argv``/``env`` (``pass_fds`` inherited under their numbers:
    they stay open through the shim's exec), and the read end of its report pipe.

    Raises ValueError (a NUL byte ...) before anything is forked, OSError if the pipes, the
    memfd or the shim's own exec fail.
    """
    spec = execshim.encode_spec(argv, env)
    with contextlib.ExitStack() as parent_copies:  # the shim has its own once Popen returns
        spec_fd = memfd_holding(spec)
        parent_copies.callback(os.close, spec_fd)
        report_r, report_w = _report_pipe()
        parent_copies.callback(os.close, report_w)
        try:
            popen = subprocess.Popen(
                [*_SHIM, str(os.getpid()), str(spec_fd), str(report_w)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                pass_fds=(spec_fd, report_w, *pass_fds),
            )
        except BaseException:
            os.close(report_r)
            raise
    return popen, report_r


def _read_report(report_r: int) -> bytes:
    """The shim's report, read to EOF: empty once the engine is exec'd (close-on-exec)."""
    chunks = []
    try:
        while chunk := os.read(report_r, 64):
            chunks.append(chunk)
    finally:
        os.close(report_r)
    return b"".join(chunks)


class EngineProcess:
    """A running engine process; ``pid`` is also its process group id."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str],
                 pass_fds: Sequence[int] = ()) -> None:
        """Spawn ``argv`` with exactly ``env`` (and ``pass_fds`` open); returns once it is
        exec'd.

        Raises ValueError (a NUL byte, an empty command) before anything is forked, OSError
        with Popen's errno and file name when the exec fails, SubprocessError when the shim
        could not run at all, RuntimeError off the main thread.
        """
        _check_forking_thread()
        self._popen, report_r = _start_shim(argv, env, pass_fds)
        assert self._popen.stdout is not None and self._popen.stderr is not None
        self.pid = self._popen.pid
        self.stdout: IO[bytes] = self._popen.stdout
        self.stderr: IO[bytes] = self._popen.stderr
        try:
            report = _read_report(report_r)
        except BaseException:  # interrupted (KeyboardInterrupt): nobody would own the shim
            self._discard()
            raise
        if report == execshim.STARTED:
            return
        cause, said = self._discard()
        if report.startswith(execshim.STARTED):
            failed = int(report[len(execshim.STARTED):])
            raise OSError(failed, os.strerror(failed), argv[0])
        raise subprocess.SubprocessError(f"the exec shim ({_SHIM[0]}) ended before it ran "
                                         f"({cause}){': ' + said if said else ''}")

    def _discard(self) -> tuple[str, str]:
        """The shim did not become the engine: end it (it exits by itself after reporting)
        and collect it here -- the caller registers no pid, so the reaper must not find an
        unknown child -- and close its output pipes. Its exit cause and last line of stderr.
        """
        os.kill(self.pid, signal.SIGKILL)  # still our unreaped child: the pid is its own
        status = os.waitpid(self.pid, 0)[1]
        self.reaped(status)
        self.stdout.close()
        with self.stderr:  # what it wrote is in the pipe; never wait for more
            os.set_blocking(self.stderr.fileno(), False)
            try:
                said = os.read(self.stderr.fileno(), _STDERR_KEPT)
            except BlockingIOError:
                said = b""
        lines = said.decode(errors="replace").strip().splitlines()
        return exit_cause(status)[0], (lines[-1].strip() if lines else "")[:200]

    def reaped(self, wait_status: int) -> None:
        """Record the exit status collected by the reaper (so Popen never waits itself)."""
        self._popen.returncode = os.waitstatus_to_exitcode(wait_status)

    def signal_group(self, signum: int) -> bool:
        """Signal the whole process group; False if nothing in it is left."""
        return signal_group(self.pid, signum)


def signal_group(pgid: int, signum: int) -> bool:
    """Signal the process group ``pgid``; False if nothing in it is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def exit_cause(wait_status: int) -> tuple[str, bool]:
    """(``exit_N`` | ``signal_NAME`` | ``core_dumped``, clean) from a raw waitpid status, for
    processes without OOM accounting (one-shot commands); engines use
    :func:`cuzkd.supervisor.core.exitcause.process_cause` with their OOM counters."""
    return process_cause(ended(wait_status), supervisor_killed=False, oom_kills_moved=False)
