"""SIGHUP: apply the config file again -- add, remove and restart changed engines only.

A reload is the one supervisor-wide operation with a protocol of its own towards systemd
(``Type=notify-reload``): ``RELOADING=1`` when it begins and ``READY=1`` only once the engines
were added, removed and restarted, so ``systemctl reload`` returns when the new config runs.
A bad file is refused whole and the running config kept; the outcome feeds
``cuzkd_config_last_reload_successful``. Reloads never overlap (a lock) and never run once the
supervisor is stopping. SIGHUPs that arrive during a reload make one more reload after it, not
one each: that one reads the file as it is by then, so a script sending a signal per edited
file costs one reload, not a queue of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from cuzkd.config import Config, ConfigError, default_config
from cuzkd.supervisor.configread import OffLoopReader, reload_config
from cuzkd.supervisor.engines import EngineSet
from cuzkd.supervisor.notify import Notifier
from cuzkd.supervisor.views import SupervisorViews

log = structlog.get_logger("cuzkd.supervisor")


class ConfigReloader:
    def __init__(self, engines: EngineSet, views: SupervisorViews, notifier: Notifier, *,
                 stopping: Callable[[], bool], on_applied: Callable[[], None]) -> None:
        self._engines = engines
        self._views = views
        self._notifier = notifier
        self._stopping = stopping
        self._on_applied = on_applied
        self._lock = asyncio.Lock()
        self._reader = OffLoopReader(reload_config)
        #: a reload is waiting for the running one to end (further requests join it)
        self._queued = False

    async def reload(self) -> None:
        """Read the file the running config came from (the embedded default without one) and
        apply it; one that does not validate changes nothing. Returns at once when a reload is
        already waiting to run."""
        if self._queued:
            return
        self._queued = True
        async with self._lock:
            self._queued = False
            if self._stopping():
                return
            views = self._views
            views.phase = "reloading"
            self._notifier.reloading()
            path = self._engines.config.path
            try:
                new = await self._reader.read(path) if path else default_config()
            except ConfigError as exc:
                views.reload_ok = False
                log.error("reload_refused", error=str(exc), detail="keeping the running config")
            else:
                views.reload_ok = True
                views.reload_success_at = time.time()
                await self._apply(new)
            finally:
                # READY=1 ends the reload for systemd (`systemctl reload` returns): only once
                # the engines were added, removed and restarted, and never after STOPPING=1.
                if views.phase == "reloading":
                    views.phase = "running"
                    self._notifier.send("READY=1", views.status_line())

    async def _apply(self, new: Config) -> None:
        old = self._engines.config
        if (new.supervisor, new.metrics) != (old.supervisor, old.metrics):
            log.warning("reload_partial", detail="[supervisor] and [metrics] changes take "
                                                 "effect at the next start")
        await self._engines.apply(new)
        self._on_applied()
