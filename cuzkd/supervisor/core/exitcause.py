"""Why an engine process ended, as one label value from a fixed, documented set.

An operator reading ``cuzkd_engine_exits_total{cause=...}`` needs the cause they can act on,
not the raw wait status: a SIGKILL from the kernel's OOM killer and one from the supervisor's
own stop escalation look the same to ``waitpid``. So causes are decided by precedence:

1. the supervisor's own intent -- :data:`cuzkd.states.INTENT_CAUSES`: ``stopped`` (an
   operator's stop or restart, a reload, shutdown), ``swap`` (a binary swap's rolling restart),
   ``unhealthy``, ``stalled``, ``start_timeout`` -- decided by the lifecycle, which knows why it
   stopped the process;
2. ``oom_killed``: a SIGKILL the supervisor did not send, while an OOM-kill counter moved (see
   :mod:`cuzkd.supervisor.proc.oom`);
3. ``core_dumped``: the process dumped core (WCOREDUMP: SIGSEGV, SIGABRT, ... with core
   dumps enabled);
4. ``signal_NAME``: killed by another signal (``signal_SIGKILL``, ``signal_SIGTERM``);
5. ``daemonized``: exited 0 while its descendants ran on -- it forked into the background, so
   cuzkd supervises nothing (and ends them: see :data:`DAEMONIZED_ERROR`); not clean;
6. ``exit_N``: exited with status N (``exit_0`` is a clean exit).

Pure: the caller decodes the wait status (:func:`cuzkd.supervisor.proc.reaper.ended`), reads
the counters and says whether it sent SIGKILL itself.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from cuzkd.states import ExitCause

#: What a ``daemonized`` exit tells the operator (the log event, ``last_error``).
DAEMONIZED_ERROR = ("the engine's process exited 0 while its descendants ran on -- engines "
                    "must run in the foreground")


@dataclass(frozen=True)
class ProcessEnd:
    """How a process ended, decoded from its wait status."""

    #: the signal that killed it, or None when it exited
    signal: int | None
    #: its exit status when it exited (None when a signal killed it)
    exit_code: int | None
    core_dumped: bool = False


def process_cause(end: ProcessEnd, *, supervisor_killed: bool, oom_kills_moved: bool,
                  descendants_left: bool = False) -> tuple[str, bool]:
    """(cause, clean) of how a process ended, without the supervisor's intent.

    ``supervisor_killed``: the supervisor sent SIGKILL to this process (its stop escalation or
    a hurried stop), so a SIGKILL death is never blamed on the OOM killer. ``oom_kills_moved``:
    an OOM-kill counter covering the process grew while it ran. ``descendants_left``: some
    of its descendants were still alive when it had exited. ``clean`` is True only for
    ``exit_0``.
    """
    if end.signal is not None:
        if end.signal == signal.SIGKILL and oom_kills_moved and not supervisor_killed:
            return ExitCause.OOM_KILLED, False
        if end.core_dumped:
            return ExitCause.CORE_DUMPED, False
        return f"signal_{signal_name(end.signal)}", False
    if end.exit_code == 0 and descendants_left:
        return ExitCause.DAEMONIZED, False
    return f"exit_{end.exit_code}", end.exit_code == 0


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
