"""What the supervisor's HTTP faces need from it, as small protocols.

The control API (:mod:`.control_routes`) acts on a :class:`ControlTarget`; the read-only listener
(:mod:`.metrics_routes`) shows a :class:`ScrapeTarget`; a binary swap restarts engines through
:class:`cuzkd.swap.rolling.SwapTarget`. The engine set and the composition root implement them; no
module needs the daemon to be typed, so tests serve these faces from small stand-ins.
"""

from __future__ import annotations

from typing import Protocol

from cuzkd.metrics.sample import SupervisorSample
from cuzkd.supervisor.engines.info import EngineInfo


class ControlTarget(Protocol):
    """The engines as the control API sees them (implemented by the engine set)."""

    @property
    def stopping(self) -> bool:
        """The supervisor's phase is ``stopping``: nothing is started any more."""
        ...

    def has_engine(self, name: str) -> bool: ...

    def engines_info(self) -> list[EngineInfo]: ...

    def engine_info(self, name: str) -> EngineInfo: ...

    async def restart_engine(self, name: str, *, swap: bool = False) -> None: ...

    async def start_engine(self, name: str) -> None: ...

    async def stop_engine(self, name: str) -> str | None: ...

    async def wait_running(self, name: str) -> str | None: ...


class ScrapeTarget(Protocol):
    """The supervisor as ``/metrics`` and ``/status`` show it (the readout implements it)."""

    async def sample(self, max_age: float = 1.0) -> SupervisorSample: ...

    async def status_body(self) -> bytes:
        """The ``/status`` JSON; the same object while the document is unchanged."""
        ...
