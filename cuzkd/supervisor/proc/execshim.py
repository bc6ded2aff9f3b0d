"""The exec shim: the child's half of an engine spawn, so that no Python runs between fork and exec.

Popen forks and execs this module as a fresh, single-threaded ``python -I -S`` with no
``preexec_fn``; :func:`main` arms ``PR_SET_PDEATHSIG``, checks its parent, reads the engine's
spec from a memfd (:func:`encode_spec`) and execs the engine in place, reporting a failed exec's
errno on a close-on-exec pipe. It imports only what a bare interpreter has, plus ``ctypes`` for
prctl and execve, to start in about 20 ms. Why a shim and what each step guards against is
docs/design/supervisor.md, *Spawning: preexec_fn while threads run*.
"""

from __future__ import annotations

# The signal module's C core, loaded by every interpreter at start-up; ``import signal`` would
# add ~7 ms (enum) to each spawn.
import _signal  # type: ignore[import-not-found]
import ctypes
import errno
import os
import sys

#: Not ``typing.TYPE_CHECKING``: importing typing would triple the shim's start-up (mypy reads
#: any ``TYPE_CHECKING`` as true; at run time these imports, ~2 ms more, are skipped).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

PR_SET_PDEATHSIG = 1

#: The shim's first word on the report pipe: all is ready (PDEATHSIG armed, spec read), only
#: the exec is left.
STARTED = b"+"
#: The shim's exit status when the supervisor died before PDEATHSIG was armed.
EXIT_SUPERVISOR_GONE = 125
#: The shim's exit status after it reported a failed exec (as a shell's "command not found").
EXIT_EXEC_FAILED = 127

#: exec errors that only mean "not in this directory": the PATH search goes on past them.
_NOT_HERE = (errno.ENOENT, errno.ENOTDIR)


def exec_candidates(executable: bytes, env: Mapping[str, str]) -> list[bytes]:
    """The paths to try for ``executable``, as Popen computes them: the name itself when it has
    a directory part, else the name in each directory of the ``PATH`` *of env* (the default
    path when env has none)."""
    if b"/" in executable:  # os.path.dirname(executable) is not empty
        return [executable]
    return [os.path.join(os.fsencode(directory), executable)  # noqa: PTH118 -- bytes paths
            for directory in os.get_exec_path(env)]


def encode_spec(argv: Sequence[str], env: Mapping[str, str]) -> bytes:
    """What the shim needs to exec ``argv`` with exactly ``env``, NUL-separated.

    Raises ValueError for what Popen refuses before forking (a NUL byte anywhere, ``=`` in a
    variable's name, a name that does not encode) and for an empty ``argv`` (Popen's
    IndexError), so a bad command never gets as far as a process.
    """
    if not argv:
        raise ValueError("empty command")
    args = [os.fsencode(arg) for arg in argv]
    envp = []
    for name, value in env.items():
        key = os.fsencode(name)
        if b"=" in key:
            raise ValueError("illegal environment variable name")
        envp.append(key + b"=" + os.fsencode(value))
    candidates = exec_candidates(args[0], env)
    fields = [b"%d" % len(candidates), *candidates, b"%d" % len(args), *args, *envp]
    if any(b"\0" in field for field in fields):
        raise ValueError("embedded null byte")
    return b"\0".join(fields)


def decode_spec(spec: bytes) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """(candidates, argv, envp) from :func:`encode_spec`'s bytes; ValueError if cut short."""
    fields = spec.split(b"\0")
    try:
        ncand = int(fields[0])
        nargs = int(fields[1 + ncand])
    except IndexError:
        raise ValueError("truncated spec") from None
    candidates, args = fields[1:1 + ncand], fields[2 + ncand:2 + ncand + nargs]
    if len(args) != nargs or not args:
        raise ValueError("truncated spec")
    return candidates, args, fields[2 + ncand + nargs:]


def _c_strings(items: list[bytes]) -> ctypes.Array[ctypes.c_char_p]:
    """A NULL-terminated ``char *[]`` (argv, envp)."""
    return (ctypes.c_char_p * (len(items) + 1))(*items, None)


def exec_first(libc: ctypes.CDLL, candidates: list[bytes], args: list[bytes],
               envp: list[bytes]) -> int:
    """execve the first candidate that runs (never returns then); else the errno to report:
    the first that is not ENOENT/ENOTDIR, or the last (what Popen's child reports).

    libc's execve rather than :func:`os.execve`, which adds checks of its own (an empty
    ``argv[0]``, an empty variable name) that Popen's exec never made.
    """
    c_args, c_envp = _c_strings(args), _c_strings(envp)
    first, last = 0, errno.ENOENT
    for path in candidates:
        libc.execve(path, c_args, c_envp)
        last = ctypes.get_errno()
        if not first and last not in _NOT_HERE:
            first = last
    return first or last


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def main(supervisor_pid: int, spec_fd: int, report_fd: int) -> int:
    """Arm PDEATHSIG, exec the engine; the exit status if that could not be done."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0)
    if os.getppid() != supervisor_pid:
        return EXIT_SUPERVISOR_GONE
    candidates, args, envp = decode_spec(_read_all(spec_fd))
    os.close(spec_fd)
    os.set_inheritable(report_fd, False)  # pass_fds made it inheritable; the engine must not get it
    # Popen's restore_signals reset these for the shim, then the interpreter's start-up ignored
    # them again, and ignored signals survive exec.
    for signum in (_signal.SIGPIPE, _signal.SIGXFSZ):
        _signal.signal(signum, _signal.SIG_DFL)
    os.write(report_fd, STARTED)  # nothing but the exec is left to fail
    # The errno in decimal. The pipe is close-on-exec: EOF right after STARTED means the exec
    # succeeded, and EOF with nothing at all means the shim never got this far.
    os.write(report_fd, b"%d" % exec_first(libc, candidates, args, envp))
    return EXIT_EXEC_FAILED


if __name__ == "__main__":
    os._exit(main(*(int(arg) for arg in sys.argv[1:4])))
