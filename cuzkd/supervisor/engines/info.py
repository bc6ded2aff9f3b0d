"""One engine as the control API, ``/status``, the SIGUSR1 dump and the CLI show it.

The daemon builds an :class:`EngineInfo` per engine (:meth:`EngineRunner.info
<cuzkd.supervisor.engines.runner.EngineRunner.info>`), the faces encode it as JSON, and
``cuzkd status``/``start``/``stop``/``restart`` decode that JSON back into it: one typed
definition of the entry on both sides of the socket. The CLI imports this module, so it needs
nothing but ``msgspec`` and the vocabulary (``cuzkd status`` must not pay for aiohttp, NumPy or
the engine). Every field but the name and the state has a default: a client still reads an
entry from a supervisor that did not send a field yet.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cuzkd.states import State
from cuzkd.status.document import StaleJob

#: At most this many stale jobs per engine entry: the reply stays small however many a cuzk
#: has left listed (``cuzk_stale_jobs`` counts them all).
MAX_STALE_JOBS_SHOWN = 50


class EngineInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Fields in the order the JSON has always had them (a script may print it)."""

    name: str
    state: State
    pid: int | None = None
    #: unix time of the current process's spawn
    started_at: float | None = None
    restarts: int = 0
    last_exit_cause: str | None = None
    #: exit cause -> count
    exits: dict[str, int] = {}
    #: unix time of the pending restart (in backoff only)
    next_restart_at: float | None = None
    last_error: str | None = None
    #: the start is held by the GPU memory gate
    waiting_for_gpu: bool = False
    stalled: bool = False
    stalls_total: int = 0
    #: the last stderr lines of the process that exited last
    last_exit_stderr: list[str] = []
    status_address: str | None = None
    command: list[str] = []
    #: the release a ``{binary}`` engine's process executes
    release: str | None = None
    #: the last decoded status document's values that did not decode
    status_field_errors: str | None = None
    #: a plain cuzk's listed jobs that are failed work (the oldest first, at
    #: most MAX_STALE_JOBS_SHOWN), and its workers shown proving but not busy
    stale_jobs: list[StaleJob] = []
    phantom_busy_workers: list[int] = []

    def as_json(self) -> dict[str, Any]:
        """The JSON object the control API serves."""
        encoded: dict[str, Any] = msgspec.to_builtins(self)
        return encoded

