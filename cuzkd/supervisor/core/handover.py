"""The hand-over: what a running supervisor gives the program that replaces it in place.

``cuzkd upgrade`` re-executes cuzkd under the same PID (docs/operations.md, *Upgrading cuzkd in
place*). Everything the old code knew that the new code needs to carry on -- without a signal
to an engine, a restart or a counter going down -- crosses the exec in this one document, JSON
in a memfd whose descriptor the new program is told. It is plain data, versioned by
:data:`FORMAT`: a program that reads another format refuses the hand-over in its dry run, so a
downgrade across a format change is a restart, never a misread state.

What is in it, and why: the descriptors that must stay open, each named by number (the locks,
so no second cuzkd starts in the gap; the listeners, so no connection is refused; each child's
output pipes, so its lines are still read); each engine's lifecycle (state, process, times on
the supervisor's run clock, restart history and backoff) and door seat; the door process and
its channel's listener; the supervisor's clock, phase and config text; the exported counters
(:mod:`cuzkd.metrics.carry`). The rest -- status documents, derived figures, stall watches --
is read again by the new code.
"""

from __future__ import annotations

import msgspec

from cuzkd.errors import HandoverRefused
from cuzkd.metrics.carry import CarriedSample
from cuzkd.metrics.door_metrics import DoorFigures

#: The hand-over's format: a program reads exactly one (see module doc).
FORMAT = 1


class Child(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A running child of the supervisor: its pid and its output pipes' read ends."""

    pid: int
    stdout: int
    stderr: int


class LifecycleState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An engine's :class:`~cuzkd.supervisor.core.lifecycle.Lifecycle` and backoff, field by
    field; times are on the supervisor's run clock, which the new code continues."""

    state: str
    pid: int | None
    spawned_at: float | None
    healthy_since: float | None
    last_ok: float | None
    next_start_at: float | None
    restarts: int
    exits: dict[str, int]
    last_exit_cause: str | None
    last_error: str | None
    first_answer_seconds: float | None
    started_once: bool
    exit_unexplained: bool
    backoff_failures: int


class SeatState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An engine's seat behind its door: the process admitted (by serial) and how the last
    one ended, as the door process was told."""

    address: str | None
    serial: int
    #: how the last process ended and its serial (None: none ended yet)
    last_gone: tuple[str, int] | None


class EngineHandover(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    lifecycle: LifecycleState
    #: its running process (None: none runs)
    process: Child | None = None
    #: unix time of the process's spawn
    started_at: float | None = None
    #: the process's first answer was told to its seat
    admitted: bool = False


class DoorHandover(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The door process and what the supervisor keeps of it."""

    #: the vocabulary of its channel (the door process runs on, speaking the old code's)
    channel_version: int
    #: door address -> its listening socket
    sockets: dict[str, int]
    channel: int
    process: Child | None
    #: seconds the door process had run (its backoff reads it)
    ran_for: float
    ready: bool
    restarts: int
    exits: dict[str, int]
    #: the counts of the door processes that ended before
    ended: dict[str, DoorFigures]
    #: engine -> its seat
    seats: dict[str, SeatState]


class Locks(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    state_dir: int
    control_socket: int


class Listeners(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    control: int
    metrics: list[int]


class Handover(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int
    #: the old code's version (``supervisor_upgraded`` says old -> new)
    version: str
    #: names this upgrade: the CLI waits for its outcome
    upgrade_id: str
    #: the config file's text as it runs now (None: the embedded default), and its path
    config_text: str | None
    config_path: str | None
    demo: bool
    #: the signal mask before the old code blocked every signal for the exec
    signal_mask: list[int]
    #: the raw monotonic clock at the old code's last decision, and its run clock's freezes
    handed_at: float
    frozen_seconds: float
    freezes: int
    started_at: float
    reload_ok: bool
    reload_success_at: float
    locks: Locks
    listeners: Listeners
    engines: list[EngineHandover]
    door: DoorHandover | None
    samples: list[CarriedSample]

    def descriptors(self) -> list[int]:
        """Every descriptor the hand-over names: kept open (inheritable) across the exec."""
        fds = [self.locks.state_dir, self.locks.control_socket, self.listeners.control,
               *self.listeners.metrics]
        children = [e.process for e in self.engines]
        if self.door is not None:
            fds += [*self.door.sockets.values(), self.door.channel]
            children.append(self.door.process)
        for child in children:
            if child is not None:
                fds += [child.stdout, child.stderr]
        return fds


def encode(handover: Handover) -> bytes:
    return msgspec.json.encode(handover)


def decode(data: bytes) -> Handover:
    """The hand-over in ``data``; :class:`HandoverRefused` saying why it cannot be adopted
    (another format, or not a hand-over at all)."""
    try:
        head = msgspec.json.decode(data, type=_Head)
    except msgspec.DecodeError as exc:
        raise HandoverRefused(f"not a cuzkd hand-over: {exc}") from None
    if head.format != FORMAT:
        raise HandoverRefused(f"hand-over format {head.format} from cuzkd {head.version}: this "
                              f"cuzkd reads format {FORMAT} only (a downgrade across a format "
                              "change is a restart)")
    try:
        return msgspec.json.decode(data, type=Handover)
    except msgspec.DecodeError as exc:
        raise HandoverRefused(f"hand-over format {FORMAT} from cuzkd {head.version} does not "
                              f"decode: {exc}") from None


class _Head(msgspec.Struct):
    """What every format has: read first, so another format is named, not misread."""

    format: int
    version: str = "unknown"


class Verdict(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The new program's answer to the dry run: whether it adopts this hand-over and config,
    its version, and why not."""

    ok: bool
    version: str
    reason: str = ""
