"""Spawning engine processes and signalling their process groups.

Each engine gets its own session (so its whole tree is one process group we can SIGKILL),
stdin from /dev/null, pipes for stdout/stderr, and ``PR_SET_PDEATHSIG=SIGKILL`` so no engine
outlives a supervisor that was itself SIGKILLed. The environment is passed in whole.

We use :class:`subprocess.Popen` only for its fork/exec (it reports exec failures such as a
missing binary as exceptions), never for waiting: the supervisor's single reaper
(:mod:`cuzkd.supervisor.reaper`) collects every child with ``waitpid(-1)``, and hands the exit
status back through :meth:`EngineProcess.reaped`, which stores it on the Popen object so Popen
never waits for (or, in ``__del__``, keeps polling) a pid that may have been reused.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from cuzkd.supervisor.exitcause import process_cause

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


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


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def setup() -> None:  # runs in the child between fork and exec
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the supervisor died before prctl took effect
            os._exit(1)

    return setup


class EngineProcess:
    """A running engine process; ``pid`` is also its process group id."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self._popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
            close_fds=True,
            preexec_fn=_die_with_parent(os.getpid()),  # prctl must run in the child
        )
        self.pid = self._popen.pid
        assert self._popen.stdout is not None and self._popen.stderr is not None
        self.stdout: IO[bytes] = self._popen.stdout
        self.stderr: IO[bytes] = self._popen.stderr

    def reaped(self, wait_status: int) -> None:
        """Record the exit status collected by the reaper (so Popen never waits itself)."""
        self._popen.returncode = os.waitstatus_to_exitcode(wait_status)

    def signal_group(self, signum: int) -> bool:
        """Signal the whole process group; False if nothing in it is left."""
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            return False
        return True


def exit_cause(wait_status: int) -> tuple[str, bool]:
    """(``exit_N`` | ``signal_NAME`` | ``core_dumped``, clean) from a raw waitpid status, for
    processes without OOM accounting (one-shot commands); engines use
    :func:`cuzkd.supervisor.exitcause.process_cause` with their OOM counters."""
    return process_cause(wait_status, supervisor_killed=False, oom_kills_moved=False)
