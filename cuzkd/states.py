"""cuzkd's vocabulary: every fixed set of words the supervisor decides, counts and exports.

An engine's state, why its process ended, why the supervisor stopped it, how a drain or a swap
ended, the supervisor's own phase: each word is at once a metric label value, a log field, a
word of the control API and a value the dashboards and alerts match on. So each is defined
here, once (in the spirit of supervisord's ``states.py``), and the lifecycle, the exporter, the
swap coordinator, the CLI and the dashboards generator import it: a word cannot be added in one
place and missed in another. Each set is a ``StrEnum`` whose members *are* their strings (JSON,
f-strings and comparisons with the strings the control API carries see the word), iterated in
the order it is exported in.

Dependency-free (only :mod:`enum`): every layer, and ``grafana/generate.py``, may import it.
"""

from __future__ import annotations

import enum


class State(enum.StrEnum):
    """One engine's lifecycle state (:mod:`cuzkd.supervisor.core.lifecycle`): the ``state``
    label of ``cuzkd_engine_state``, in the order of the dashboards' state codes (1, 2, ...)."""

    #: spawned (or its spawn waits), status not answered yet
    STARTING = "starting"
    #: status answered (or, without a status URL, alive through its settle time)
    RUNNING = "running"
    #: waiting to restart after a failure
    BACKOFF = "backoff"
    #: stop signal sent (or the drain before it under way)
    STOPPING = "stopping"
    STOPPED = "stopped"
    #: will not restart on its own: the restart policy, or the command cannot be spawned
    FAILED = "failed"


#: A process runs, or its spawn is on the way, and the supervisor means it to: its health is
#: polled, its figures sampled, and a stop request stops it.
ALIVE: frozenset[State] = frozenset({State.STARTING, State.RUNNING})
#: No process, and none comes unless an operator asks: a start spawns at once, and a wait for
#: the engine to stop is over.
AT_REST: frozenset[State] = frozenset({State.STOPPED, State.FAILED})
#: Right after a start request, the spawn is still to come: the process being stopped must exit
#: first (a restart), or the backoff's spawn was not made yet.
START_PENDING: frozenset[State] = frozenset({State.STOPPING, State.BACKOFF})
#: Where a start request settles: the engine is up, or it will not be up without more time
#: (``backoff``) or another request; ``starting`` and ``stopping`` are on the way elsewhere.
START_SETTLED: frozenset[State] = frozenset(State) - {State.STARTING, State.STOPPING}


class Phase(enum.StrEnum):
    """The supervisor's own phase, which decides what a reload or a start request may do."""

    #: the engines are being spawned from the file just read: a reload waits for ``running``
    STARTING = "starting"
    RUNNING = "running"
    #: the config file is being applied again (another reload request is queued)
    RELOADING = "reloading"
    #: shutdown: no engine starts any more
    STOPPING = "stopping"
    #: ``cuzkd upgrade`` asks the new program's dry run, then re-executes: no reload meanwhile
    UPGRADING = "upgrading"


class ExitCause(enum.StrEnum):
    """How an engine's process ended: the fixed ``cause`` label values of
    ``cuzkd_engine_exits_total``. With ``signal_NAME``
    and ``exit_N`` they are the whole set; :mod:`cuzkd.supervisor.core.exitcause` decides
    between them and documents the precedence. ``panic``, ``error`` and ``usage`` are cuzk's
    own exit statuses (101, 1, 2), named for engines of type ``cuzk`` only: another engine's
    exit 1 means what that engine says, so it stays ``exit_1``."""

    #: an operator's stop or restart, a reload, the shutdown
    STOPPED = "stopped"
    #: a binary swap's rolling restart
    SWAP = "swap"
    UNHEALTHY = "unhealthy"
    STALLED = "stalled"
    START_TIMEOUT = "start_timeout"
    #: a SIGKILL the supervisor did not send, while an OOM-kill counter moved
    OOM_KILLED = "oom_killed"
    #: the process dumped core (WCOREDUMP)
    CORE_DUMPED = "core_dumped"
    #: cuzk exited 101: a Rust panic on its main thread (``thread 'main' panicked at ...``)
    PANIC = "panic"
    #: cuzk exited 1: ``Error: ...`` from its main (bad config, a listener it could not bind)
    ERROR = "error"
    #: cuzk exited 2: its command line was refused (an unknown flag, such as ``--version``)
    USAGE = "usage"
    #: it exited 0 while its descendants ran on: it put itself in the background
    DAEMONIZED = "daemonized"


class StopReason(enum.StrEnum):
    """Why the supervisor stops an engine. The lifecycle decides it with the stop and keeps it
    until the process exits: it is what the exit is counted as (:data:`STOP_EXIT_CAUSES`) and,
    for the stops in :data:`WORK_LOST_REASONS`, the ``reason`` label of
    ``cuzkd_engine_stop_inflight_partitions_total``."""

    #: an operator's stop, restart or start request
    OPERATOR = "operator"
    RELOAD = "reload"
    #: a binary swap's rolling restart
    SWAP = "swap"
    #: the stall watchdog's kill (``stall_action = "restart"``)
    STALL = "stall"
    SHUTDOWN = "shutdown"
    #: its status went silent for unhealthy_after, or its gRPC answers were not cuzk's
    UNHEALTHY = "unhealthy"
    #: its status did not answer within start_timeout
    START_TIMEOUT = "start_timeout"


#: The stops an operator asked for (a stop or restart, a reload, a swap or rollback, the
#: shutdown): they drain, and their drains take deadline calls.
OPERATOR_STOPS: frozenset[StopReason] = frozenset({
    StopReason.OPERATOR, StopReason.RELOAD, StopReason.SWAP, StopReason.SHUTDOWN})
#: The stops whose in-flight work is counted as thrown away, in the order they are exported:
#: a health kill's is not (the engine's last status is not to be trusted then).
WORK_LOST_REASONS: tuple[StopReason, ...] = (
    StopReason.OPERATOR, StopReason.RELOAD, StopReason.SWAP, StopReason.STALL,
    StopReason.SHUTDOWN)
#: The exit cause counted for a process the supervisor stopped, by why it stopped it: the
#: supervisor's reason takes precedence over what the process itself died of.
STOP_EXIT_CAUSES: dict[StopReason, ExitCause] = {
    StopReason.OPERATOR: ExitCause.STOPPED,
    StopReason.RELOAD: ExitCause.STOPPED,
    StopReason.SWAP: ExitCause.SWAP,
    StopReason.STALL: ExitCause.STALLED,
    StopReason.SHUTDOWN: ExitCause.STOPPED,
    StopReason.UNHEALTHY: ExitCause.UNHEALTHY,
    StopReason.START_TIMEOUT: ExitCause.START_TIMEOUT,
}
#: The causes the supervisor's reason decides: an exit counted as one of these was the
#: supervisor's doing, not the engine's.
SUPERVISOR_CAUSES: frozenset[ExitCause] = frozenset(STOP_EXIT_CAUSES.values())


class UpgradeResult(enum.StrEnum):
    """How a ``cuzkd upgrade`` ended (``GET /v1/upgrade``'s ``outcome``)."""

    #: the new code took the supervisor over (told by the new code)
    UPGRADED = "upgraded"
    #: the gate, asked again just before the exec, refused it: nothing changed
    REFUSED = "refused"
    #: the exec, or what led to it, failed: the old code runs on
    FAILED = "failed"


class DrainResult(enum.StrEnum):
    """How a stop sequence's drain ended: the ``result`` label of ``cuzkd_engine_drains_total``."""

    #: the engine went quiet (or drained itself) within drain_timeout
    CLEAN = "clean"
    #: drain_timeout ran out with work in flight
    TIMEOUT = "timeout"


class SwapResult(enum.StrEnum):
    """How a swap or a rollback ended (what ``cuzkd swap`` reports)."""

    OK = "ok"
    ROLLED_BACK = "rolled_back"
    REFUSED = "refused"
    #: a rollback that could not bring every engine back
    FAILED = "failed"
    #: the supervisor shut down while it ran (the store was put back as it found it)
    CANCELLED = "cancelled"


#: The ``result`` label of ``cuzkd_binary_swaps_total``, always exported (0 before the first):
#: a swap that ``failed`` counts as ``rolled_back`` (the store was flipped back).
SWAP_RESULTS: tuple[SwapResult, ...] = (
    SwapResult.OK, SwapResult.ROLLED_BACK, SwapResult.REFUSED, SwapResult.CANCELLED)
#: The ``result`` label of ``cuzkd_binary_rollbacks_total`` (``cuzkd swap --rollback``): a
#: rollback refused (no accepted release to go to) or undone (its engines failed) is ``failed``;
#: one the supervisor's shutdown cut short is ``cancelled``.
ROLLBACK_RESULTS: tuple[SwapResult, ...] = (SwapResult.OK, SwapResult.FAILED, SwapResult.CANCELLED)


class OnInconclusive(enum.StrEnum):
    """What a swap does when its canary analysis is ``inconclusive`` (``cuzkd swap
    --on-inconclusive``, a word of the control API)."""

    PROCEED = "proceed"
    ROLLBACK = "rollback"


class ConnectionClose(enum.StrEnum):
    """Why cuzkd closed a connection of its metrics listener: the ``reason`` label of
    ``cuzkd_metrics_connections_closed_total`` (:mod:`cuzkd.supervisor.web`)."""

    #: accepted at the connection limit and reset at once
    REFUSED = "refused"
    #: no byte moved for the idle timeout (10 s)
    IDLE = "idle"
    #: a response still being sent at the response deadline (120 s)
    DEADLINE = "deadline"
    #: its response progressed longest ago when all responses together passed the send budget
    SEND_BUDGET = "send_budget"


class DoorRefusal(enum.StrEnum):
    """Why cuzkd's gRPC door (:mod:`cuzkd.supervisor.core.doorbook`) answered a call itself with
    an error instead of relaying it: the ``reason`` label of the door's refusal counter. Each
    reason has one gRPC code (the book's ``REFUSAL_CODES``): ``UNAVAILABLE`` (a caller may try
    again) but ``unknown_job`` (``NOT_FOUND``, as cuzk answers an ``AwaitProof`` of a job it does
    not hold), ``deadline`` (``DEADLINE_EXCEEDED``), ``quarantined`` (``FAILED_PRECONDITION``)
    and ``already_exists`` (``ALREADY_EXISTS``)."""

    #: no engine could take it and the door already held ``hold_max_calls`` calls
    HOLD_FULL_CALLS = "hold_full_calls"
    #: no engine could take it and holding it would pass ``hold_max_bytes``
    HOLD_FULL_BYTES = "hold_full_bytes"
    #: held for ``hold_timeout`` and still no engine could take it
    HOLD_TIMEOUT = "hold_timeout"
    #: cuzkd stopped (a restart, a stop): the call was still held, or on an engine, when its
    #: door closed
    SHUTTING_DOWN = "shutting_down"
    #: its engine ended (or its link broke) under it, and it cannot be sent again: not a
    #: ``Prove``/``SubmitProof``, or sent again once already
    ENGINE_LOST = "engine_lost"
    #: a ``Prove``/``SubmitProof`` its engine ended under that was not kept for a retry
    #: (``retry_max_bytes`` was full when it was sent)
    RETRY_FULL = "retry_full"
    #: an ``AwaitProof`` of a job no engine behind the door holds
    UNKNOWN_JOB = "unknown_job"
    #: a deadline call (``[metrics] proof_deadlines``) that can no longer be proved in time:
    #: its deadline less its kind's ``[door] proving_allowance`` passed before an engine took it
    DEADLINE = "deadline"
    #: its ``request_id`` is quarantined: an engine crashed twice with it in flight, the second
    #: time with no other suspect beside it
    QUARANTINED = "quarantined"
    #: its ``request_id`` is in flight behind the door already, with other request bytes
    ALREADY_EXISTS = "already_exists"


class DoorRetry(enum.StrEnum):
    """Why the door sent a ``Prove``/``SubmitProof`` a second time (same bytes, same
    ``request_id``): the ``reason`` label of the door's retry counter."""

    #: the call's link to its engine broke (the first sign of a dying process, usually)
    BROKEN = "broken"
    #: its engine's process ended without a stop: exit, kill, OOM, a stall kill
    CRASH = "crash"
    #: its engine was stopped with the call still in flight (the drain ran out of time)
    STOP = "stop"


class DoorAbandon(enum.StrEnum):
    """Why a drain stopped waiting for a call or job its engine had: the engine shows it no
    longer has it (cuzk dropped it, and will never answer): the ``reason`` label of
    ``cuzkd_door_drain_abandoned_total``."""

    #: a PoRep or SnapDeals call whose ``request_id`` two ``/status`` reads in a row did not
    #: list, with nothing of its kind pending in ``GetStatus``
    NOT_LISTED = "not_listed"
    #: a PoSt call whose kind two ``GetStatus`` reads in a row showed nothing pending or in
    #: progress for (an overwritten PoSt)
    POST_QUEUE_EMPTY = "post_queue_empty"
    #: a PoSt call past its deadline: its caller has given up on it
    PAST_DEADLINE = "past_deadline"
    #: a job a ``SubmitProof`` gave the engine, no longer shown, after a grace for its
    #: ``AwaitProof`` (or an ``AwaitProof`` of such a job)
    JOB_NOT_LISTED = "job_not_listed"


class HoldEnd(enum.StrEnum):
    """How a call held in a front door (no engine could take it when it came) left the hold:
    the ``outcome`` label of ``cuzkd_door_hold_duration_seconds``."""

    #: an engine behind the door took it
    PLACED = "placed"
    #: the door refused it (``hold_timeout``, its shutdown: :class:`DoorRefusal` says which)
    REFUSED = "refused"
    #: its caller cancelled it, or its own deadline passed, while it was held
    CANCELLED = "cancelled"
