"""Why an engine process ended, as one label value from a fixed, documented set.

An operator reading ``cuzkd_engine_exits_total{cause=...}`` needs a cause to act on, not the raw
wait status: the kernel's OOM killer and the supervisor's own stop escalation both SIGKILL. So
causes go by precedence: the supervisor's own stop reason first, decided by the lifecycle which
knows why it stopped the process, then :func:`process_cause`: an OOM kill, a core dump, a
signal, a cuzk's own exit statuses, a daemonized engine, the plain exit status. It is pure: the
caller decodes the wait status (:func:`cuzkd.supervisor.proc.reaper.ended`), reads the OOM
counters and says whether it sent SIGKILL itself. :func:`exit_message` reads a cuzk exit's words
from its last stderr lines once they are all read, a moment after the cause. The table is
docs/supervisor.md, *Exit causes*.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import takewhile

from cuzkd.states import ExitCause
from cuzkd.supervisor.core.doorbook import EngineEnd

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


#: cuzk's exit statuses that say what it died of; any other status is ``exit_N``.
CUZK_EXIT_CAUSES: dict[int, ExitCause] = {
    101: ExitCause.PANIC, 1: ExitCause.ERROR, 2: ExitCause.USAGE}


def process_cause(end: ProcessEnd, *, supervisor_killed: bool, oom_kills_moved: bool,
                  cuzk: bool = False, descendants_left: bool = False) -> tuple[str, bool]:
    """(cause, clean) of how a process ended, without the supervisor's intent.

    ``supervisor_killed``: the supervisor sent SIGKILL to this process (its stop escalation or
    a hurried stop), so a SIGKILL death is never blamed on the OOM killer. ``oom_kills_moved``:
    an OOM-kill counter covering the process grew while it ran. ``cuzk``: the engine is of
    type ``cuzk``, whose exit statuses have names. ``descendants_left``: some of its
    descendants were still alive when it had exited. ``clean`` is True only for ``exit_0``.
    """
    if end.signal is not None:
        if end.signal == signal.SIGKILL and oom_kills_moved and not supervisor_killed:
            return ExitCause.OOM_KILLED, False
        if end.core_dumped:
            return ExitCause.CORE_DUMPED, False
        return f"signal_{signal_name(end.signal)}", False
    if cuzk and end.exit_code in CUZK_EXIT_CAUSES:
        return CUZK_EXIT_CAUSES[end.exit_code], False
    if end.exit_code == 0 and descendants_left:
        return ExitCause.DAEMONIZED, False
    return f"exit_{end.exit_code}", end.exit_code == 0


#: Longest exit message kept (it becomes ``last_error``, one line of ``cuzkd status``).
MESSAGE_CHARS = 500
#: A Rust panic's first line: ``thread 'main' panicked at src/x.rs:L:C:`` (Rust 1.73 on, the
#: message on the lines below), ``thread 'main' panicked at 'msg', src/x.rs:L:C`` (before),
#: newer releases put the thread id after the name: ``thread 'main' (4711) panicked at``.
_PANIC = re.compile(r"thread '(?P<thread>[^']*)'(?: \(\d+\))? panicked at (?P<rest>.*)")
#: Where a panic's message ends: the hint or the backtrace Rust writes after it.
_PANIC_END = ("note: ", "stack backtrace:")
#: One cause of several in anyhow's ``Caused by:`` list (``    0: failed to bind``).
_NUMBERED_CAUSE = re.compile(r"\s+\d+: (?P<text>.*)")


def door_end(cause: str, *, drained: bool, stopped: bool) -> EngineEnd:
    """How the door sees a process's end: after a stop that drained it, after another stop of
    the supervisor's (``stopped``: it sent the stop signal or SIGKILL), an OOM kill, or a
    crash -- the only end that makes the calls it had suspects (:mod:`.doorbook`)."""
    if drained:
        return EngineEnd.DRAINED
    if stopped:
        return EngineEnd.STOPPED
    if cause == ExitCause.OOM_KILLED:
        return EngineEnd.OOM_KILLED
    return EngineEnd.CRASHED


def exit_message(cause: str | None, lines: Sequence[str]) -> str | None:
    """What a cuzk process said it died of, from its last stderr lines, for ``cause``
    (:data:`CUZK_EXIT_CAUSES`): the panic with its location and message, the ``Error: ...``
    line with its causes, the usage error. None for other causes, or when the lines do not
    hold it (a long backtrace can push a panic out of the tail)."""
    decode = _DECODERS.get(cause) if cause is not None else None
    found = decode(lines) if decode is not None else None
    return found[:MESSAGE_CHARS] if found else None


def _panic(lines: Sequence[str]) -> str | None:
    """The main thread's last panic (the one that ends the process with 101), else the last
    panic of any thread."""
    starts = [(i, m) for i, line in enumerate(lines) if (m := _PANIC.match(line))]
    if not starts:
        return None
    i, match = next(((i, m) for i, m in reversed(starts) if m["thread"] == "main"), starts[-1])
    head = lines[i].strip()
    if not match["rest"].endswith(":"):  # the old one-line form says it all
        return head
    message = []
    for line in lines[i + 1:]:
        if line.startswith(_PANIC_END) or _PANIC.match(line):
            break
        message.append(line.strip())
    return " ".join([head, *filter(None, message)])


def _error(lines: Sequence[str]) -> str | None:
    """anyhow's report of the error main returned: ``Error: what`` then, after ``Caused
    by:``, one indented cause or several numbered ones; as ``Error: what: cause: cause``."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Error: ")]
    if not starts:
        return None
    parts = [lines[starts[-1]].strip()]
    rest = lines[starts[-1] + 1:]
    if "Caused by:" in rest:
        causes = list(takewhile(lambda line: not line or line[0].isspace(),
                                rest[rest.index("Caused by:") + 1:]))
        numbered = [m["text"].strip() for line in causes if (m := _NUMBERED_CAUSE.match(line))]
        first = next((line.strip() for line in causes if line.strip()), None)
        parts += numbered or ([first] if first else [])
    return ": ".join(parts)


def _usage(lines: Sequence[str]) -> str | None:
    """clap's ``error: ...`` line (the usage text and the ``--help`` hint after it say
    nothing more)."""
    return next((line.strip() for line in reversed(lines) if line.startswith("error: ")), None)


_DECODERS: dict[str, Callable[[Sequence[str]], str | None]] = {
    ExitCause.PANIC: _panic, ExitCause.ERROR: _error, ExitCause.USAGE: _usage}


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
