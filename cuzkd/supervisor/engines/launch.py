"""What one engine's spawn runs: its command line, its environment, its status socket, and the
GPU memory it waits for first.

The runner decides *when* to spawn (its lifecycle does); this is *what* a spawn runs, built once
from the engine's table and resolved at each spawn -- ``{binary}`` names whichever release is
active at that moment, not at start-up. Kept apart from the runner so that the runner holds the
engine's story (states, stops, health) and this its recipe.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from structlog.typing import FilteringBoundLogger

from cuzkd.config import (
    BINARY_PLACEHOLDER,
    Config,
    EngineConfig,
    door_address,
    engine_command,
    grpc_address,
    status_address,
)
from cuzkd.gpus import GpuView
from cuzkd.supervisor.core.gpugate import cuda_env
from cuzkd.supervisor.engines.gpuwait import wait_for_gpus
from cuzkd.supervisor.proc import pids

#: Gives argv[0] for ``{binary}`` at every spawn; raises SpawnError when there is none.
BinaryResolver = Callable[[], str]


class EngineLaunch:
    """One engine's spawn recipe (see the module doc)."""

    def __init__(self, spec: EngineConfig, config: Config, binary_resolver: BinaryResolver,
                 gpu_view: GpuView | None) -> None:
        self._spec = spec
        #: the command as configured (``{binary}`` unresolved): what logs and the API show
        self.argv = engine_command(config, spec)
        self.status_address = status_address(config, spec)
        #: the socket the engine binds in cuzkd's state dir, made ready before each spawn
        self._socket_path = _own_socket(spec, config)
        self._binary_resolver = binary_resolver
        #: NVML, for the GPU memory gate of an engine with ``gpus`` (None: no gate)
        self._gpu_view = gpu_view if spec.gpus else None
        self._gpu_env = cuda_env(spec.gpus, hide_others=not spec.cuzk) if spec.gpus else {}
        #: pids of the previous process and its descendants (must release GPU memory first)
        self._previous: set[int] = set()

    @property
    def gated(self) -> bool:
        """Whether a spawn first waits for GPU memory (the engine is pinned to GPUs)."""
        return self._gpu_view is not None

    def previous_process_ended(self, pids_of_it: set[int]) -> None:
        """The process and descendants whose GPU memory the next spawn waits to see freed."""
        self._previous = pids_of_it

    def command(self) -> list[str]:
        """The argv to exec now: ``{binary}`` resolved (SpawnError when no release is
        active)."""
        argv = list(self.argv)
        if argv[0] == BINARY_PLACEHOLDER:
            argv[0] = self._binary_resolver()
        return argv

    def environment(self) -> dict[str, str]:
        """The supervisor's environment, the engine's ``env``, its GPU pinning, and the
        ``CUZKD_ENGINE`` mark its descendants inherit."""
        return {**os.environ, **self._spec.env, **self._gpu_env,
                pids.ENGINE_ENV: self._spec.name}

    def prepare(self) -> None:
        """The engine's socket in the state dir: its directory made and private, a stale
        socket removed (it would look alive)."""
        if self._socket_path is not None:
            self._socket_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._socket_path.unlink(missing_ok=True)

    async def wait_for_gpus(self, log: FilteringBoundLogger) -> None:
        """Hold the spawn until the pinned GPUs hold nothing of the previous process and have
        ``gpu_memory_needed`` free, or ``gpu_release_timeout`` passed (then say why)."""
        if self._gpu_view is None:
            return
        spec = self._spec
        result = await wait_for_gpus(self._gpu_view, spec.gpus, self._previous,
                                     spec.gpu_memory_needed, spec.gpu_release_timeout)
        if not result.ready:
            log.warning("gpu_gate_timed_out", gpus=spec.gpus, reason=result.reason,
                        waited_seconds=round(result.waited_seconds, 3))
        elif result.reads > 1:
            log.info("gpu_gate_passed", gpus=spec.gpus,
                     waited_seconds=round(result.waited_seconds, 3))


def _own_socket(spec: EngineConfig, config: Config) -> Path | None:
    """The Unix socket cuzkd chose for the engine to bind: a bundled engine's status socket,
    else the private gRPC socket of an engine behind a door (the engine binds it, but does
    not make its directory)."""
    address = (status_address(config, spec) or "") if spec.bundled else ""
    if address.startswith("unix:"):
        return Path(address.removeprefix("unix:"))
    private = grpc_address(config, spec) if door_address(config, spec) is not None else None
    return Path(private.removeprefix("unix://")) if private is not None else None
