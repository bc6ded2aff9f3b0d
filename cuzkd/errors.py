"""Every exception cuzkd raises, and the exit codes they end a command with.

Every error derives from :class:`CuzkdError` and names its exit code (sysexits.h where one
fits), so :func:`cuzkd.cli.dispatch.main` maps errors to exit codes by attribute, once, and a
new error cannot be forgotten there. They are all defined here, grouped by the part of cuzkd
that raises them, so one module lists what can go wrong. Dependency-free at run time (grpc is
named for the type checker only): every layer may import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

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


# -- the shared modules ----------------------------------------------------------------------


class KindTwice(CuzkdError, ValueError):
    """A table a person wrote names one kind by two spellings (``winning`` and
    ``winning-post``): which of the two values is meant cannot be guessed."""

    def __init__(self, key: str, first: str, kind: str) -> None:
        super().__init__(f"{key!r} and {first!r} both name proof kind {kind!r}: keep one")
        #: the later of the two keys, the one to name in the error
        self.key = key


class GpuViewError(CuzkdError):
    """The GPU driver does not answer (:mod:`cuzkd.gpus`)."""


# -- configuration ---------------------------------------------------------------------------


class ConfigError(CuzkdError):
    """A configuration mistake; the message is meant for the operator as is."""

    exit_code = EX_CONFIG


class WebConfigError(CuzkdError):
    """A problem with a web config file: the dotted ``key`` ("" for the file) and why."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


class CuzkFileError(CuzkdError):
    """A problem with a cuzk file: ``key`` is the dotted key ("" for the file as a whole)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(problem)
        self.key = key
        self.problem = problem


# -- reading an engine -----------------------------------------------------------------------


class MalformedWire(CuzkdError, ValueError):
    """Bytes the protobuf wire format cannot walk (:mod:`cuzkd.cuzk.wire`)."""


class ReadFailed(CuzkdError):
    """One gRPC read of an engine told nothing (:mod:`cuzkd.cuzk.client`, which never lets it
    out): ``reason`` is the bounded failure reason, the message the sentence to log."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class StatusFetchError(CuzkdError):
    """A fetch failed; the message says why (never empty). ``kind`` is a short, bounded key
    (``timeout``, ``connect``, ``http_500``, ``too_large``, ``invalid``, ...) for rate-limited
    logging."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class StatusDecodeError(CuzkdError, ValueError):
    """The bytes are not a status document; the message says which field is wrong."""


class Unsalvageable(CuzkdError, ValueError):
    """Nothing of the type could be kept; the message is the error that left none."""


# -- binary swaps ----------------------------------------------------------------------------


class HistoryError(CuzkdError):
    """The history file cannot be read or written; the message names the file and the problem."""


class ReleaseError(CuzkdError):
    """A release operation was refused or found the store unusable; the message says why."""


class SwapInProgress(CuzkdError):
    """Another swap holds the lock; the caller answers 409."""


class SwapCancelled(CuzkdError):
    """The swap coordinator was closed while the operation waited; the message says why."""


# -- the bundled engine ----------------------------------------------------------------------


class BackendError(CuzkdError, RuntimeError):
    """The requested backend or devices are not available."""

    exit_code = EX_CONFIG


class ProverConfigError(CuzkdError, ValueError):
    """Invalid configuration; the message names the file and the key."""

    exit_code = EX_CONFIG


class BudgetExceededError(CuzkdError, ValueError):
    """A reservation larger than the whole budget: it could never be granted."""


class JobRequestError(CuzkdError, ValueError):
    """A job request the engine cannot accept (the message says which field is wrong)."""


class EngineDrainingError(CuzkdError, RuntimeError):
    """The engine is shutting down and accepts no new jobs."""


class ListenError(CuzkdError):
    """``--listen`` cannot be served; ``exit_code`` is EX_USAGE (the address itself is wrong)
    or EX_UNAVAILABLE (the address is fine but cannot be used now)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class BenchError(CuzkdError, RuntimeError):
    """The engine refused a request or answered something unexpected."""


class GrpcError(CuzkdError):
    """A gRPC call answered with ``code`` and ``message`` and nothing else: raised by the
    door's handlers and the bundled engine's, and ended by their servers."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# -- the supervisor --------------------------------------------------------------------------


class SpawnError(CuzkdError):
    """A spawn refused before any process was started: there is no executable to give it
    (``{binary}`` with no active release). Never transient: an operator must act."""


class StateDirBusy(CuzkdError):
    """Another live supervisor holds the lock; the message names it and what it holds."""


class StartupError(CuzkdError):
    """The daemon cannot start (state dir locked, port taken); the message says why."""


class DoorAddressError(CuzkdError):
    """The door cannot listen where it should (something answers there, a bad group, a bind
    failure); the message names the address. The supervisor does not start."""


class BadRequest(CuzkdError, ValueError):
    """The bytes are not the method's request message (the message says which it expected)."""


class RequestIdTooLong(BadRequest):
    """The request names a ``request_id`` or ``job_id`` over the door's limit
    (:data:`cuzkd.supervisor.door.requests.MAX_REQUEST_ID_BYTES`)."""


class HandoverRefused(CuzkdError):
    """A hand-over of ``cuzkd upgrade`` this program cannot adopt (another format, a config
    it refuses): the upgrade is refused with this reason and nothing changes."""


class UpgradeRefused(CuzkdError):
    """``cuzkd upgrade`` was refused (the moment, or the new program's dry run) or failed:
    the supervisor runs on as it was."""


class ChannelClosed(CuzkdError):
    """The other side of the door's channel went away, or broke the protocol (the message
    says how)."""


# -- the command line ------------------------------------------------------------------------


class ControlUnavailable(CuzkdError):
    """The supervisor cannot be reached (no socket, refused, permission denied)."""

    exit_code = EX_UNAVAILABLE


class ControlRequestFailed(CuzkdError):
    """The supervisor answered with an error; the message is its ``error``, ``status`` the
    HTTP status (None for a problem the client found in the answer). Exit 1: the request was
    refused."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
