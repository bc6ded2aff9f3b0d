"""The swap itself: validate, smoke-test, install, flip, roll engines one at a time, roll back.

This module holds the orchestration only. Files are the release store's business
(:mod:`cuzkd.swap.releases`); processes are the supervisor's, reached through the small
:class:`SwapTarget` protocol so the order of steps can be tested without a daemon and the
supervisor never imports a swap policy.

Why one engine at a time: an operator swapping a binary on a GPU host would rather keep N-1
engines proving while one restarts than take the whole host down; and if the new binary is bad
only one engine has been moved onto it when that becomes clear. On failure ``current`` is
flipped back first, so every engine restarted afterwards -- by us or by a crash -- comes back on
the old release.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog

from cuzkd.swap.releases import Release, ReleaseError, ReleaseStore

SwapResult = Literal["ok", "rolled_back", "refused", "failed"]

#: Results counted in ``cuzkd_binary_swaps_total``; ``failed`` (a rollback that itself could not
#: bring every engine back) is counted as ``rolled_back``: the store was flipped back.
COUNTED_RESULTS: tuple[str, ...] = ("ok", "rolled_back", "refused")

Progress = Callable[[dict[str, Any]], None]

_log = structlog.get_logger(__name__)


class SwapTarget(Protocol):
    """What the swap needs from the supervisor."""

    def engine_names_using_binary(self) -> list[str]: ...

    async def restart_engine(self, name: str) -> None: ...

    async def wait_healthy(self, name: str, settle: float) -> str | None: ...

    async def run_oneshot(self, argv: Sequence[str], timeout: float) -> str: ...


class SwapInProgress(Exception):
    """Another swap holds the lock; the caller answers 409."""


@dataclass(frozen=True)
class SwapOutcome:
    result: SwapResult
    release: str | None
    previous: str | None
    reason: str | None = None
    engines: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "event": "result",
            "result": self.result,
            "release": self.release,
            "previous": self.previous,
            "reason": self.reason,
            "engines": self.engines,
        }


def _ignore(event: dict[str, Any]) -> None:
    del event


class SwapCoordinator:
    """Runs swaps and rollbacks one at a time and counts their results."""

    def __init__(
        self,
        store: ReleaseStore,
        target: SwapTarget,
        *,
        keep_releases: int,
    ) -> None:
        self.store = store
        self.target = target
        self.keep_releases = keep_releases
        self.counts: dict[str, int] = dict.fromkeys(COUNTED_RESULTS, 0)
        self._lock = asyncio.Lock()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def active_release(self) -> str | None:
        """The active release id; None when there is none or the store is unusable."""
        try:
            active = self.store.active()
        except (ReleaseError, OSError):
            return None
        return active.id if active else None

    def refuse(self, reason: str) -> SwapOutcome:
        """Count and describe a swap refused before anything changed."""
        self._count("refused")
        _log.warning("swap_refused", reason=reason)
        return SwapOutcome("refused", self.active_release(), None, reason)

    async def swap(
        self,
        source: Path,
        *,
        smoke_args: Sequence[str] | None = None,
        smoke_timeout: float = 30.0,
        settle: float = 10.0,
        progress: Progress = _ignore,
    ) -> SwapOutcome:
        """Swap the active release to a copy of ``source`` and roll the engines onto it."""
        async with self._exclusive():
            try:
                self.store.validate_source(source)
                # Refusals found while copying (the source changed, a full disk) and a
                # failed flip below change nothing the engines run: still a refusal.
                release = await asyncio.to_thread(self.store.install, source)
            except (ReleaseError, OSError) as exc:
                return self.refuse(str(exc))
            self._step(progress, "installed", release=release.id, binary=str(release.binary))
            if smoke_args is not None:
                cause = await self.target.run_oneshot(
                    [str(release.binary), *smoke_args], smoke_timeout
                )
                self._step(progress, "smoke_test", release=release.id, cause=cause)
                if cause != "exit_0":
                    return self.refuse(f"smoke test {list(smoke_args)} ended with {cause}")
            try:
                previous = await asyncio.to_thread(self.store.activate, release)
            except (ReleaseError, OSError) as exc:
                return self.refuse(f"cannot activate release {release.id}: {exc}")
            self._step(
                progress, "activated", release=release.id,
                previous=previous.id if previous else None,
            )
            outcome = await self._roll(release, previous, settle, progress)
            if outcome.result == "ok":
                removed = await asyncio.to_thread(self.store.prune, self.keep_releases)
                if removed:
                    self._step(progress, "pruned", releases=[r.id for r in removed])
            return outcome

    async def rollback(self, *, settle: float = 10.0, progress: Progress = _ignore) -> SwapOutcome:
        """Flip back to the previous release and roll the engines onto it."""
        async with self._exclusive():
            try:
                current = self.store.active()
                restored = await asyncio.to_thread(self.store.rollback)
            except (ReleaseError, OSError) as exc:
                return self.refuse(str(exc))
            self._step(progress, "activated", release=restored.id,
                       previous=current.id if current else None)
            engines = self.target.engine_names_using_binary()
            failure = await self._restart_each(engines, settle, progress)
            result: SwapResult = "ok" if failure is None else "failed"
            self._count("ok" if failure is None else "rolled_back")
            return SwapOutcome(result, restored.id, current.id if current else None,
                               failure, engines)

    async def _roll(
        self, release: Release, previous: Release | None, settle: float, progress: Progress
    ) -> SwapOutcome:
        engines = self.target.engine_names_using_binary()
        moved: list[str] = []
        for name in engines:
            moved.append(name)
            reason = await self._restart_one(name, settle, progress)
            if reason is not None:
                return await self._undo(release, previous, moved, reason, settle, progress)
        self._count("ok")
        _log.info("swap_done", release=release.id, engines=engines)
        return SwapOutcome("ok", release.id, previous.id if previous else None, None, engines)

    async def _undo(
        self,
        release: Release,
        previous: Release | None,
        moved: list[str],
        reason: str,
        settle: float,
        progress: Progress,
    ) -> SwapOutcome:
        self._count("rolled_back")
        if previous is None:
            # Nothing to go back to (the first release of a fresh state dir): leave it active,
            # the engines stay in backoff/failed and the operator sees why.
            self._step(progress, "rollback_impossible", reason=reason)
            return SwapOutcome("failed", release.id, None, reason, moved)
        try:
            await asyncio.to_thread(self.store.rollback)
        except (ReleaseError, OSError) as exc:
            # current still names the new release: the moved engines stay on it.
            self._step(progress, "rollback_impossible", reason=f"{reason}; {exc}")
            return SwapOutcome("failed", release.id, previous.id,
                               f"{reason}; cannot roll back: {exc}", moved)
        self._step(progress, "rolled_back", release=previous.id, reason=reason)
        failure = await self._restart_each(moved, settle, progress)
        detail = reason if failure is None else f"{reason}; after rollback: {failure}"
        return SwapOutcome("rolled_back", previous.id, release.id, detail, moved)

    async def _restart_each(
        self, names: Sequence[str], settle: float, progress: Progress
    ) -> str | None:
        """Restart engines in order; return the first failure reason, if any."""
        for name in names:
            reason = await self._restart_one(name, settle, progress)
            if reason is not None:
                return reason
        return None

    async def _restart_one(self, name: str, settle: float, progress: Progress) -> str | None:
        self._step(progress, "restarting", engine=name)
        try:
            await self.target.restart_engine(name)
            reason = await self.target.wait_healthy(name, settle)
        except KeyError:
            # A reload removed the engine while the swap was rolling: nothing left to move.
            self._step(progress, "skipped", engine=name, reason="engine removed by a reload")
            return None
        if reason is None:
            self._step(progress, "healthy", engine=name)
            return None
        self._step(progress, "unhealthy", engine=name, reason=reason)
        return f"engine {name}: {reason}"

    def _exclusive(self) -> asyncio.Lock:
        if self._lock.locked():
            raise SwapInProgress("a swap is already in progress")
        return self._lock

    def _count(self, result: str) -> None:
        self.counts[result] += 1

    @staticmethod
    def _step(progress: Progress, step: str, **fields: Any) -> None:
        _log.info("swap_step", step=step, **fields)
        progress({"event": step, **fields})
