"""Applying the config file again -- add, remove and restart changed engines only.

Two ways in: SIGHUP, and ``POST /v1/reload`` on the control socket, which ``cuzkd reload``
calls and which answers only once the reload is over, with its outcome. The shipped unit's
``ExecReload`` is that command rather than ``kill -HUP``: a signal returns at once, so
``systemctl reload`` (systemd before 253 has no ``Type=notify-reload``) would return before
the new config runs, and could never report a refused file.

A reload sends ``RELOADING=1`` when it begins and ``READY=1`` once the engines were added,
removed and restarted. A bad file is refused whole and the running config kept; the outcome
feeds ``cuzkd_config_last_reload_successful``. Reloads never overlap (a lock) and never run
once the supervisor is stopping. Requests that arrive during a reload make one more reload
after it, not one each: that one reads the file as it is by then, and every request that
joined it gets its outcome.

Whether a reload may run, and the outcome it leaves, are the supervisor's phase
(:class:`~cuzkd.supervisor.core.phase.SupervisorPhase`): the reload is, with the composition
root, its only writer, through its reload transitions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from aiohttp import web

from cuzkd.config import Config, default_config, demo_config, plan_doors
from cuzkd.errors import ConfigError
from cuzkd.httperrors import error_response
from cuzkd.supervisor.core.phase import SupervisorPhase
from cuzkd.supervisor.daemon.configread import OffLoopReader, log_notices, reload_config
from cuzkd.supervisor.daemon.notify import Notifier
from cuzkd.supervisor.engines.engineset import EngineSet

log = structlog.get_logger("cuzkd.supervisor")


@dataclass(frozen=True)
class ReloadOutcome:
    """``error`` None: the file was read and applied; else why nothing changed."""

    error: str | None
    #: the engines configured after it
    engines: tuple[str, ...]
    #: the file was fine, the moment was not (the supervisor is starting or stopping)
    busy: bool = False


class ConfigReloader:
    def __init__(self, engines: EngineSet, phase: SupervisorPhase, notifier: Notifier, *,
                 status_line: Callable[[], str], on_applied: Callable[[], None]) -> None:
        """``status_line``: sd_notify's ``STATUS=`` sent with ``READY=1``."""
        self._engines = engines
        self._phase = phase
        self._notifier = notifier
        self._status_line = status_line
        self._on_applied = on_applied
        self._lock = asyncio.Lock()
        self._reader = OffLoopReader(reload_config)
        #: the outcome of the reload waiting for the running one to end (requests join it)
        self._queued: asyncio.Future[ReloadOutcome] | None = None

    async def reload(self) -> ReloadOutcome:
        """Read the file the running config came from (the embedded default without one) and
        apply it; one that does not validate changes nothing. A reload already waiting to
        run is joined: its outcome is returned."""
        if self._queued is not None:
            return await asyncio.shield(self._queued)
        queued = self._queued = asyncio.get_running_loop().create_future()
        try:
            async with self._lock:
                self._queued = None
                outcome = await self._reload_once()
        except BaseException:
            queued.cancel()  # those who joined are told it did not happen
            raise
        queued.set_result(outcome)
        return outcome

    async def on_signal(self) -> None:
        """SIGHUP's reload: its outcome is in the log and the metrics (nobody waits for it)."""
        await self.reload()

    def routes(self) -> Callable[[web.Application], None]:
        """A control-app hook adding ``POST /v1/reload``: 200 once the file is applied, 422
        when it was refused (the error names the file and key), 409 while starting or
        stopping."""
        async def handle(request: web.Request) -> web.Response:
            del request
            outcome = await self.reload()
            if outcome.error is None:
                return web.json_response({"applied": True, "engines": list(outcome.engines)})
            return error_response(409 if outcome.busy else 422, f"reload refused: {outcome.error}")

        def hook(app: web.Application) -> None:
            app.router.add_post("/v1/reload", handle)

        return hook

    async def _reload_once(self) -> ReloadOutcome:
        phase = self._phase
        why = phase.begin_reload()
        if why is not None:
            return ReloadOutcome(f"the supervisor is {why}", tuple(self._engines.names()),
                                 busy=True)
        self._notifier.reloading()
        path = self._engines.config.path
        try:
            new = await self._reader.read(path) if path else default_config()
            if self._engines.config.demo:
                new = demo_config(new)
            _same_doors(self._engines.config, new)
        except ConfigError as exc:
            phase.reload_read(False, time.time())
            log.error("supervisor_reload_refused", error=str(exc),
                      detail="keeping the running config")
            return ReloadOutcome(str(exc), tuple(self._engines.names()))
        else:
            phase.reload_read(True, time.time())
            log_notices(new)
            await self._apply(new)
            return ReloadOutcome(None, tuple(self._engines.names()))
        finally:
            # READY=1 ends the reload for systemd: only once the engines were added, removed
            # and restarted, and never after STOPPING=1.
            if phase.end_reload():
                self._notifier.send("READY=1", self._status_line())

    async def _apply(self, new: Config) -> None:
        old = self._engines.config
        if (new.supervisor, new.metrics) != (old.supervisor, old.metrics):
            log.warning("supervisor_reload_partial",
                        detail="[supervisor] and [metrics] changes take effect at the next start")
        if plan_doors(new) != plan_doors(old):
            log.warning("supervisor_reload_partial",
                        detail="the front doors' bounds ([door]) change at the next start")
        await self._engines.apply(new)
        self._on_applied()


def _same_doors(old: Config, new: Config) -> None:
    """A reload keeps the front doors where they are, in front of the same engines: they are
    bound once, before the engines start (an engine moved behind a door that is not served
    would be reachable by nobody); ConfigError naming the change otherwise. Their bounds
    (``[door]``) take effect at the next start (``supervisor_reload_partial``)."""
    if _where(new) != _where(old):
        now = ", ".join(f"{d.address} ({', '.join(d.engines)})" for d in plan_doors(old)) or "none"
        raise ConfigError(f"{new.path or 'config'}: the front doors ([[engine]] door, [door]) "
                          f"change only at cuzkd's next start (serving: {now})")


def _where(config: Config) -> list[tuple[str, tuple[str, ...]]]:
    return [(door.address, door.engines) for door in plan_doors(config)]
