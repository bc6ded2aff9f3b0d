"""The errors cuzkd refuses with, and the exit codes they end a command with.

Every error a command can end with derives from :class:`CuzkdError` and names its exit code
(sysexits.h where one fits), so :func:`cuzkd.cli.dispatch.main` maps errors to exit codes by
attribute, once, and a new error cannot be forgotten there. Dependency-free: every layer may
import it.
"""

from __future__ import annotations

#: sysexits.h EX_USAGE: a command line the program cannot use.
EX_USAGE = 64
#: sysexits.h EX_UNAVAILABLE: a service needed is not there (the supervisor's control socket).
EX_UNAVAILABLE = 69
#: sysexits.h EX_TEMPFAIL: try again later (a swap the supervisor's shutdown cancelled).
EX_TEMPFAIL = 75
#: sysexits.h EX_CONFIG: a bad configuration file.
EX_CONFIG = 78
#: A command whose output pipe closed exits as if SIGPIPE had ended it (128 + 13).
EX_SIGPIPE = 141


class CuzkdError(Exception):
    """Base of cuzkd's own errors; ``exit_code`` is what a command ends with when one escapes."""

    exit_code: int = 1
