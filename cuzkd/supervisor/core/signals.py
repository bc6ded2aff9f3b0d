"""What each signal means to the supervisor: one table, and the decision for one arrival.

A signal with no handler does the kernel's default, which for most is to end the process on
the spot: no log line, no drain, and PDEATHSIG then SIGKILLs every engine and its proofs in
flight. So every signal whose default is to terminate, or to dump core without being a fault,
gets a meaning in :data:`TABLE` (stop, reload, dump state, dump stacks, ignore), and
:data:`LEFT_ALONE` keeps the faults and the harmless ones at their default. Handling them also
keeps them working as PID 1 in a container. This module is pure, numbers and phase names in and
a decision out; :mod:`cuzkd.supervisor.daemon.signalinstall` installs the table and the daemon
carries decisions out. See docs/supervisor.md, *Signals* and *Stray signals and start-up*.
"""

from __future__ import annotations

import enum
import signal

from cuzkd.states import Phase


class Meaning(enum.Enum):
    STOP = "stop"
    RELOAD = "reload"
    DUMP_STATE = "dump_state"
    DUMP_STACKS = "dump_stacks"
    IGNORE = "ignore"


def _present(*names: str) -> list[int]:
    """The signals of ``names`` this platform has (``SIGSTKFLT``, ``SIGPWR``: Linux only)."""
    return [int(getattr(signal, name)) for name in names if hasattr(signal, name)]


#: Signals that mean nothing to the supervisor, yet end a process by default.
_MEANINGLESS = [
    *_present("SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGIO", "SIGPWR", "SIGXCPU",
              "SIGXFSZ", "SIGSTKFLT"),
    *range(signal.SIGRTMIN, signal.SIGRTMAX + 1),
]

#: signal number -> what it means; every signal here gets a handler.
TABLE: dict[int, Meaning] = {
    signal.SIGTERM: Meaning.STOP,
    signal.SIGINT: Meaning.STOP,
    signal.SIGHUP: Meaning.RELOAD,
    signal.SIGUSR1: Meaning.DUMP_STATE,
    # never kills, as the JVM and Go do: a core dump of a daemon holding engines is never wanted
    signal.SIGQUIT: Meaning.DUMP_STACKS,
    **dict.fromkeys(_MEANINGLESS, Meaning.IGNORE),
}

#: Signals deliberately given no handler: a process that faulted cannot be trusted to go on and
#: its core is the evidence; SIGPIPE stays ignored as Python's start-up set it; SIGCHLD is the
#: reaper's; job control and the informational signals do nothing harmful by default.
LEFT_ALONE = frozenset(_present("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGSYS", "SIGABRT",
                                "SIGTRAP", "SIGPIPE", "SIGCHLD", "SIGTSTP", "SIGTTIN", "SIGTTOU",
                                "SIGCONT", "SIGWINCH", "SIGURG", "SIGKILL", "SIGSTOP"))


class Decision(enum.Enum):
    """What the daemon does for one arrival, and the line it logs: (event -- None when the act
    logs itself --, level, what the line says is done, or why nothing is).

    An enum rather than a dataclass: :func:`cuzkd.supervisor.daemon.signalinstall.hold` imports this
    module first thing at start-up, and it must cost no more than ``enum`` (which ``signal``
    loads anyway).
    """

    STOP = ("signal_received", "info", "stopping engines")
    HURRY = ("signal_received", "warning", "killing engines now")
    RELOAD = (None, "info", "reload")
    NO_RELOAD = ("signal_ignored", "warning", "no reload while starting or stopping")
    DUMP_STATE = ("signal_received", "info", "dumping engine state")
    DUMP_STACKS = ("signal_received", "info", "dumping task and thread stacks")
    IGNORE = ("signal_ignored", "warning",
              "means nothing to the supervisor (handled so that it cannot kill it)")

    @property
    def event(self) -> str | None:
        event: str | None = self.value[0]
        return event

    @property
    def level(self) -> str:
        level: str = self.value[1]
        return level

    @property
    def detail(self) -> str:
        detail: str = self.value[2]
        return detail


def name_of(signum: int) -> str:
    """``SIGUSR1``; ``SIGRTMIN+3`` for a real-time signal Python has no name for."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        if signal.SIGRTMIN < signum <= signal.SIGRTMAX:
            return f"SIGRTMIN+{signum - signal.SIGRTMIN}"
        return f"signal {signum}"


def decide(signum: int, phase: Phase, stops: int) -> Decision:
    """The decision for ``signum`` arriving in ``phase`` (``starting``, ``running``,
    ``reloading``, ``stopping``) after ``stops`` stop signals.

    A signal missing from :data:`TABLE` (never installed, but asked about) is ignored.
    """
    meaning = TABLE.get(signum, Meaning.IGNORE)
    if meaning is Meaning.STOP:
        return Decision.STOP if stops == 0 else Decision.HURRY
    if meaning is Meaning.RELOAD:
        # While reloading, another is queued (the file may have changed again); never while
        # starting (the engines are being spawned from the file just read) or stopping.
        return (Decision.RELOAD if phase in (Phase.RUNNING, Phase.RELOADING)
                else Decision.NO_RELOAD)
    if meaning is Meaning.DUMP_STATE:
        return Decision.DUMP_STATE
    if meaning is Meaning.DUMP_STACKS:
        return Decision.DUMP_STACKS
    return Decision.IGNORE
