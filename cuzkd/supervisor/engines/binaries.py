"""The releases ``{binary}`` engines execute: the release store, seeded, and ``{binary}``.

One :class:`EngineBinaries` per :class:`~cuzkd.supervisor.daemon.root.Supervisor`, kept across
SIGHUP reloads. It is the engine set's
:class:`~cuzkd.supervisor.engines.engineset.BinaryReleases`: the path to exec for ``{binary}``
at every spawn, the release a running process executes. The composition root builds it, hands
it to the engine set, and builds the swap coordinator over the same store (the swap package
knows nothing about the supervisor: it restarts engines through the ``SwapTarget`` protocol,
which the engine set implements), so the dependency runs supervisor → swap only.

``initial_binary`` only seeds a store that has no active release. When the store already has
one and ``initial_binary`` holds other content, the active release is kept and
``initial_binary_ignored`` is logged: changing the binary must go through ``cuzkd swap``, which
health-checks each engine and rolls back, never through a restart that would silently move
every engine at once (and could not roll back).

A release put into service without a swap's health checks (the seed, or one a crash left on
trial) is accepted in the release history once every ``{binary}`` engine has been healthy for
``release_settle``: the coordinator's ``accept_when_healthy``, a task the supervisor owns.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from cuzkd.config import BINARY_PLACEHOLDER, SupervisorConfig
from cuzkd.errors import ReleaseError, SpawnError
from cuzkd.swap.history import ReleaseOrigin
from cuzkd.swap.releases import ReleaseStore, release_of_pid, source_release_id

log = structlog.get_logger("cuzkd.supervisor")

#: Cached pid → release lookups; cleared when exceeded (a few entries per engine spawn).
_RELEASE_CACHE_MAX = 1024


class EngineBinaries:
    def __init__(self, config: SupervisorConfig, state_dir: Path) -> None:
        self.store = ReleaseStore(state_dir)
        self._initial = Path(config.initial_binary) if config.initial_binary else None
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
            self.store.put_in_service(release, ReleaseOrigin.INITIAL_BINARY)
            self.store.activate(release)
            log.info("initial_binary_installed", release=release.id, source=str(initial))
            return
        initial_id = source_release_id(initial)
        if initial_id != active.id:
            log.warning("initial_binary_ignored", initial_binary=str(initial),
                        initial_release=initial_id, active_release=active.id,
                        detail="the active release stays; `cuzkd swap PATH` changes it")

    def resolve(self) -> str:
        """The runner's ``binary_resolver``: the active binary's real path, at every spawn."""
        try:
            return self.store.active_binary()
        except ReleaseError as exc:
            raise SpawnError(f"command uses {BINARY_PLACEHOLDER}: {exc} (set "
                             "supervisor.initial_binary or run `cuzkd swap PATH`)") from None

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
