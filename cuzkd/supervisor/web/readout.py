"""The supervisor as its read-only faces show it: ``/metrics``, ``/status``, ``/v1/supervisor``.

:class:`SupervisorViews` implements :class:`~cuzkd.supervisor.web.targets.StatusView` from the
parts the composition root built -- the engine set, the child table -- and the few facts only
the root knows (its phase, its bound address, the last reload's outcome), which it writes into
the view's attributes. Nothing here changes state.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import structlog

from cuzkd.gpus import GpuViewError, NvmlDevice
from cuzkd.metrics.sample import SupervisorSample
from cuzkd.ratelimit import LimitedLog
from cuzkd.states import Phase
from cuzkd.supervisor.engines.engineset import EngineSet
from cuzkd.supervisor.proc.children import ChildTable

log = structlog.get_logger("cuzkd.supervisor")


class SupervisorViews:
    def __init__(self, engines: EngineSet, children: ChildTable, limited: LimitedLog,
                 log_drops: Callable[[], Mapping[str, int]] = dict) -> None:
        self._engines = engines
        self._children = children
        self._limited = limited
        self._log_drops = log_drops
        self.phase = Phase.STARTING
        self.started_at = time.time()
        #: the metrics listener's bound HOST:PORT, once bound
        self.metrics_address: str | None = None
        #: the last reload's outcome; the config read at start counts as the first success
        self.reload_ok = True
        self.reload_success_at = time.time()

    async def sample(self, max_age: float = 1.0) -> SupervisorSample:
        engines, binaries = self._engines, self._engines.binaries
        return SupervisorSample(
            engines=[view.sample for view in await engines.views(max_age)],
            zombies_reaped_total=self._children.zombies_reaped,
            swaps_total=dict(binaries.coordinator.counts),
            rollbacks_total=dict(binaries.coordinator.rollback_counts),
            active_release=binaries.active_release(),
            config_reload_ok=self.reload_ok,
            config_reload_success_time=self.reload_success_at,
            proof_deadlines=engines.config.metrics.deadlines(),
            gpus=await self._gpu_devices(),
            freezes_total=engines.clock.freezes,
            frozen_seconds_total=engines.clock.frozen_seconds_total,
            log_lines_dropped_total=dict(self._log_drops()),
        )

    def about(self) -> dict[str, Any]:
        """``GET /v1/supervisor``."""
        config = self._engines.config
        return {
            "pid": os.getpid(),
            "state": self.phase,
            "started_at": self.started_at,
            "config": config.path,
            "state_dir": str(config.state_dir),
            "control_socket": str(config.control_socket),
            "metrics_listen": self.metrics_address,
            "engines_running": self._engines.running(),
            "engines_total": len(self._engines),
            "zombies_reaped_total": self._children.zombies_reaped,
            "active_release": self._engines.binaries.active_release(),
        }

    async def status_document(self) -> dict[str, Any]:
        """``GET /status``: supervisor state and each engine's last status document."""
        views = await self._engines.views(max_age=1.0)
        return {"supervisor": self.about(),
                "engines": [{**v.info, "status": msgspec.to_builtins(v.sample.status)}
                            for v in views]}

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
