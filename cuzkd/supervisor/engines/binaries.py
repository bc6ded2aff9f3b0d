"""The supervisor's side of binary swaps: its release store, its swap coordinator, ``{binary}``.

One :class:`EngineBinaries` per :class:`~cuzkd.supervisor.daemon.root.Supervisor`, kept across
SIGHUP reloads so a reload never forgets swap counts or races a swap in progress. The swap
package knows nothing about the supervisor (it talks to the ``SwapTarget`` protocol); this
module is where the two meet, so the dependency runs supervisor → swap only.

``initial_binary`` only seeds a store that has no active release. When the store already has
one and ``initial_binary`` holds other content, the active release is kept and
``initial_binary_ignored`` is logged: changing the binary must go through ``cuzkd swap``, which
health-checks each engine and rolls back, never through a restart that would silently move
every engine at once (and could not roll back).

A release put into service without a swap's health checks (the seed, or one a crash left on
trial) is accepted in the release history once every ``{binary}`` engine has been healthy for
``release_settle``: :meth:`EngineBinaries.accept_when_healthy`, a task the supervisor owns.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from cuzkd.config import BINARY_PLACEHOLDER, SupervisorConfig
from cuzkd.supervisor.engines.runner import SpawnError
from cuzkd.supervisor.web.control_routes import RouteHook
from cuzkd.swap.control import swap_routes
from cuzkd.swap.releases import ReleaseError, ReleaseStore, release_of_pid, source_release_id
from cuzkd.swap.rolling import SwapCoordinator, SwapTarget

log = structlog.get_logger("cuzkd.supervisor")

#: Cached pid → release lookups; cleared when exceeded (a few entries per engine spawn).
_RELEASE_CACHE_MAX = 1024


class EngineBinaries:
    def __init__(self, config: SupervisorConfig, state_dir: Path, target: SwapTarget) -> None:
        self.store = ReleaseStore(state_dir)
        self.coordinator = SwapCoordinator(self.store, target, keep_releases=config.keep_releases)
        self._initial = Path(config.initial_binary) if config.initial_binary else None
        self._release_settle = config.release_settle
        # (pid, spawn time) → release: a process never changes its executable, and keying on the
        # spawn time too keeps a reused pid from inheriting a dead engine's answer.
        self._release_cache: dict[tuple[int, float], str | None] = {}

    def prepare(self) -> None:
        """Recover the store and seed it from ``initial_binary``.

        Run once the state dir is locked (recovery deletes temporary files that only another
        live supervisor could be writing) and before any engine spawns. A store that cannot be
        used is logged, not fatal: engines without ``{binary}`` still run, and the others fail
        with the reason until ``cuzkd swap`` succeeds. The active release is reported in the
        start-up line (only when an engine uses ``{binary}``).
        """
        try:
            self.store.recover()
            if self._initial is not None:
                self._seed(self._initial)
        except (ReleaseError, OSError) as exc:
            log.error("binary_store_unusable", state_dir=str(self.store.state_dir), error=str(exc))

    def _seed(self, initial: Path) -> None:
        active = self.store.active()
        if active is None:
            release = self.store.install(initial)
            self.store.put_in_service(release, "initial_binary")
            self.store.activate(release)
            log.info("initial_binary_installed", release=release.id, source=str(initial))
            return
        initial_id = source_release_id(initial)
        if initial_id != active.id:
            log.warning("initial_binary_ignored", initial_binary=str(initial),
                        initial_release=initial_id, active_release=active.id,
                        detail="the active release stays; `cuzkd swap PATH` changes it")

    async def accept_when_healthy(self) -> None:
        """Accept a pending active release once its engines stay healthy (see module doc)."""
        await self.coordinator.accept_when_healthy(self._release_settle)

    def resolve(self) -> str:
        """The runner's ``binary_resolver``: the active binary's real path, at every spawn."""
        try:
            return self.store.active_binary()
        except ReleaseError as exc:
            raise SpawnError(f"command uses {BINARY_PLACEHOLDER}: {exc} (set "
                             "supervisor.initial_binary or run `cuzkd swap PATH`)") from None

    def routes(self) -> RouteHook:
        """The control-app hook adding ``POST /v1/swap``."""
        return swap_routes(self.coordinator)

    def active_release(self) -> str | None:
        """The active release id; None when there is none or the store is unusable."""
        return self.coordinator.active_release()

    def release_of(self, pid: int | None, started_at: float | None) -> str | None:
        """The release the process ``pid`` executes (its ``/proc/PID/exe``), looked up once.

        Scrapes and ``cuzkd status`` call this for every ``{binary}`` engine, so the result is
        cached per spawned process.
        """
        if pid is None or started_at is None:
            return None
        key = (pid, started_at)
        if key not in self._release_cache:
            if len(self._release_cache) >= _RELEASE_CACHE_MAX:
                self._release_cache.clear()
            try:
                self._release_cache[key] = release_of_pid(pid, self.store)
            except (ReleaseError, OSError):  # the store changed under the scan: ask next time
                return None
        return self._release_cache[key]
