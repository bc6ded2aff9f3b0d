"""The supervisor as its read-only faces show it: ``/metrics``, ``/status``, ``/v1/supervisor``.

:class:`SupervisorReadout` implements :class:`~cuzkd.supervisor.web.targets.ScrapeTarget` from the
parts the composition root built -- the engine set, the child table, the swap coordinator, the
supervisor's phase and last reload outcome (read-only: a
:class:`~cuzkd.supervisor.core.phase.PhaseView`) -- and the metrics listener's bound address, which
the root sets once it is bound. Nothing here changes state.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
import structlog

from cuzkd.config import control_socket, state_dir
from cuzkd.errors import GpuViewError
from cuzkd.gpus import NvmlDevice
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.metrics.sample import ListenerAccess, SupervisorSample
from cuzkd.status.document import StatusDocument
from cuzkd.supervisor.core.phase import PhaseView
from cuzkd.supervisor.engines.engineset import EngineSet
from cuzkd.supervisor.engines.info import EngineInfo
from cuzkd.supervisor.proc.children import ChildTable
from cuzkd.swap.rolling import SwapCoordinator

log = structlog.get_logger("cuzkd.supervisor")

#: What a /status body is encoded from: the supervisor's part, then each engine's entry and
#: its status document.
StatusParts = tuple[dict[str, Any], list[tuple[EngineInfo, StatusDocument | None]]]


class SupervisorReadout:
    def __init__(self, engines: EngineSet, children: ChildTable, phase: PhaseView,
                 swaps: SwapCoordinator, limited: LimitedLog,
                 log_drops: Callable[[], Mapping[str, int]] = dict,
                 connections_closed: Callable[[], Mapping[str, int]] = dict,
                 listener_access: Callable[[], ListenerAccess] = ListenerAccess,
                 door_figures: Callable[[], Awaitable[None]] | None = None) -> None:
        """``door_figures``: brings the door process's counts up to date before a scrape
        renders them (what a caller was just answered is counted in the next scrape)."""
        self._engines = engines
        self._children = children
        self._phase = phase
        self._swaps = swaps
        self._limited = limited
        self._log_drops = log_drops
        self._connections_closed = connections_closed
        self._listener_access = listener_access
        self._door_figures = door_figures
        self.started_at = time.time()
        #: the metrics listener's bound HOST:PORT, once bound
        self.metrics_address: str | None = None
        #: the last /status body and the parts it was encoded from
        self._status: tuple[StatusParts, bytes] | None = None

    async def sample(self, max_age: float = 1.0) -> SupervisorSample:
        if self._door_figures is not None:
            await self._door_figures()
        engines, swaps = self._engines, self._swaps
        return SupervisorSample(
            engines=[view.sample for view in await engines.readings(max_age)],
            zombies_reaped_total=self._children.zombies_reaped,
            swaps_total=dict(swaps.counts),
            rollbacks_total=dict(swaps.rollback_counts),
            active_release=swaps.active_release(),
            config_reload_ok=self._phase.reload_ok,
            config_reload_success_time=self._phase.reload_success_at,
            proof_deadlines=engines.config.metrics.deadlines(),
            gpus=await self._gpu_devices(),
            freezes_total=engines.clock.freezes,
            frozen_seconds_total=engines.clock.frozen_seconds_total,
            log_lines_dropped_total=dict(self._log_drops()),
            metrics_connections_closed_total=dict(self._connections_closed()),
            listener_access=self._listener_access(),
        )

    def about(self) -> dict[str, Any]:
        """``GET /v1/supervisor``."""
        config = self._engines.config
        return {
            "pid": os.getpid(),
            "state": str(self._phase.phase),
            "started_at": self.started_at,
            "config": config.path,
            "state_dir": str(state_dir(config)),
            "control_socket": str(control_socket(config)),
            "metrics_listen": self.metrics_address,
            "engines_running": self._engines.running(),
            "engines_total": len(self._engines),
            "zombies_reaped_total": self._children.zombies_reaped,
            "active_release": self._swaps.active_release(),
        }

    async def status_body(self) -> bytes:
        """``GET /status``: supervisor state and each engine's last status document, as JSON.

        Encoded once per version of its parts, and the same bytes object returned until one
        changes: every response in flight shares it (the outbox never copies it), so 2,000
        clients reading a 1 MB document hold one copy, not 2,000, and a request costs a
        comparison, not an encoding (~15 ms for 1 MB). The status documents are compared by
        identity first (the status client hands out the same object while it reuses it).
        """
        views = await self._engines.readings(max_age=1.0)
        parts = (self.about(), [(v.info, v.sample.status) for v in views])
        if self._status is None or self._status[0] != parts:
            about, engines = parts
            body = msgspec.json.encode(
                {"supervisor": about,
                 "engines": [{**info.as_json(), "status": status} for info, status in engines]})
            self._status = (parts, body)
        return self._status[1]

    def status_line(self) -> str:
        """sd_notify's ``STATUS=``."""
        return f"STATUS={self._engines.running()}/{len(self._engines)} engines running"

    async def _gpu_devices(self) -> list[NvmlDevice]:
        view = self._engines.gpu_view
        if view is None:
            return []
        try:
            return list(await asyncio.to_thread(view.devices))
        except GpuViewError as exc:
            self._limited.log(log, "warning", "nvml_read_failed", error=str(exc))
            return []
