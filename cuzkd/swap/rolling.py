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

A shutdown cancels the operation under way (:meth:`SwapCoordinator.close`): it stops at the
wait it is in and puts ``current`` back where it found it, so the next start runs every engine
on the release that was active before, never on one that a cut-short settle period or canary
analysis did not judge.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import os
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec
import structlog

from cuzkd.errors import ReleaseError, SwapCancelled, SwapInProgress
from cuzkd.states import ROLLBACK_RESULTS, SWAP_RESULTS, OnInconclusive, SwapResult
from cuzkd.status.document import Extensions, StatusDocument
from cuzkd.swap import analysis
from cuzkd.swap.history import ReleaseOrigin, ReleaseVerdict
from cuzkd.swap.releases import Release, ReleaseStore

#: Pause between two tries at accepting a release at start while an engine is not yet up.
ACCEPT_RETRY = 1.0

Progress = Callable[[dict[str, Any]], None]

_log = structlog.get_logger("cuzkd.swap")

T = TypeVar("T")


class SwapTarget(Protocol):
    """What the swap needs from the supervisor."""

    def engine_names_using_binary(self) -> list[str]: ...

    async def restart_engine(self, name: str, *, swap: bool = False) -> None: ...

    async def wait_healthy(self, name: str, settle: float) -> str | None: ...

    async def run_oneshot(self, argv: Sequence[str], timeout: float,
                          env: Mapping[str, str] | None = None) -> str: ...

    async def engine_status(self, name: str) -> tuple[StatusDocument | None,
                                                      Extensions | None]: ...

    def engine_status_address(self, name: str) -> str | None: ...


#: What the operator's ``--check`` command finds in its environment.
CANARY_ENGINE_ENV = "CUZKD_CANARY_ENGINE"
CANARY_STATUS_ENV = "CUZKD_CANARY_STATUS_URL"


class Operation(enum.StrEnum):
    """What the coordinator is doing: the ``operation`` of its log events."""

    SWAP = "swap"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class AnalysisPlan:
    """``cuzkd swap --analysis``: move ``canary`` engines first, compare them for ``seconds``
    (see :mod:`cuzkd.swap.analysis`), then move the rest or roll back."""

    seconds: float
    canary: int = 1
    criteria: analysis.Criteria = field(default_factory=analysis.Criteria)
    #: the operator's check, already split (run without a shell)
    check: list[str] | None = None
    on_inconclusive: OnInconclusive = OnInconclusive.ROLLBACK


@dataclass
class _Underway:
    """What an operation found, and what it has put on trial: what a cancel puts back."""

    operation: Operation
    #: the release active when it began (None: none, or an unusable store)
    before: str | None
    #: a swap's new release, once put in service (verdict pending)
    trial: Release | None = None


@dataclass(frozen=True)
class SwapOutcome:
    result: SwapResult
    release: str | None
    previous: str | None
    reason: str | None = None
    engines: list[str] = field(default_factory=list)
    #: the canary analysis's report (``CanaryReport.as_json``) when the swap ran one
    analysis: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "event": "result",
            "result": self.result,
            "release": self.release,
            "previous": self.previous,
            "reason": self.reason,
            "engines": self.engines,
            "analysis": self.analysis,
        }


def _ignore(event: dict[str, Any]) -> None:
    del event


class SwapCoordinator:
    """Runs swaps and rollbacks one at a time, judges releases and counts the results.

    Wide, not deep: a swap's and a rollback's steps (install, the canary, judging it, the
    rolling restart, accepting the release) are its methods, over one swap at a time."""

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
        self.counts: dict[str, int] = dict.fromkeys(SWAP_RESULTS, 0)
        self.rollback_counts: dict[str, int] = dict.fromkeys(ROLLBACK_RESULTS, 0)
        self._lock = asyncio.Lock()
        #: why no operation may run any more (see :meth:`close`); None while open
        self.closed: str | None = None
        #: the wait the operation under way is in (see :meth:`_unless_closed`)
        self._waiting: asyncio.Future[Any] | None = None

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def close(self, reason: str) -> None:
        """Cancel the swap or rollback under way and refuse later ones, for ``reason``
        (``supervisor shutting down``).

        The operation stops at the wait it is in -- an engine's restart or settle period, the
        smoke run, the analysis window -- never inside a store write, and ends as
        ``cancelled`` (see :meth:`_cancelled`). Its engines are left to whoever closed it:
        the supervisor is stopping them.
        """
        self.closed = reason
        if self._waiting is not None:
            self._waiting.cancel()

    def active_release(self) -> str | None:
        """The active release id; None when there is none or the store is unusable."""
        try:
            active = self.store.active()
        except (ReleaseError, OSError):
            return None
        return active.id if active else None

    def active_verdict(self) -> dict[str, Any]:
        """The active release and the history's verdict on it, for ``cuzkd status``."""
        try:
            active = self.store.active()
            record = None if active is None else self.store.verdict(active)
        except (ReleaseError, OSError) as exc:
            return {"id": None, "verdict": None, "error": str(exc)}
        return {"id": active and active.id, "verdict": record and record.verdict,
                "decided_at": record and record.decided_at, "reason": record and record.reason}

    def history(self) -> dict[str, Any]:
        """The history with the active release and the rollback target, for ``--history``."""
        target = self.store.rollback_target()
        return {"active": self.active_release(), "rollback_target": target and target.id,
                "records": msgspec.to_builtins(self.store.history())}

    def refuse(self, reason: str) -> SwapOutcome:
        """Count and describe a swap refused before anything changed."""
        self._count(SwapResult.REFUSED)
        _log.warning("swap_refused", reason=reason)
        return SwapOutcome(SwapResult.REFUSED, self.active_release(), None, reason)

    async def swap(
        self,
        source: Path,
        *,
        smoke_args: Sequence[str] | None = None,
        smoke_timeout: float = 30.0,
        settle: float = 10.0,
        progress: Progress = _ignore,
        plan: AnalysisPlan | None = None,
    ) -> SwapOutcome:
        """Swap the active release to a copy of ``source`` and roll the engines onto it; with a
        ``plan``, the canaries first, judged by the analysis before the rest move."""
        return await self._cancellable(Operation.SWAP, progress, lambda underway: self._swap(
            source, smoke_args, smoke_timeout, settle, progress, plan, underway))

    async def _cancellable(
        self, operation: Operation, progress: Progress,
        work: Callable[[_Underway], Coroutine[Any, Any, SwapOutcome]],
    ) -> SwapOutcome:
        """Run ``work`` as the one operation under way; a :meth:`close` meanwhile ends it
        through :meth:`_cancelled`; after one, nothing is tried (nor counted: nothing was
        judged), and the answer is the same ``cancelled`` -- run it again later."""
        async with self._exclusive():
            if self.closed is not None:
                return SwapOutcome(SwapResult.CANCELLED, self.active_release(), None, self.closed)
            underway = _Underway(operation, self.active_release())
            try:
                return await work(underway)
            except SwapCancelled as cancel:
                return await self._cancelled(underway, str(cancel), progress)

    async def _cancelled(self, underway: _Underway, reason: str,
                         progress: Progress) -> SwapOutcome:
        """Put the store back as the cancelled operation found it.

        ``current`` is flipped back if it moved (one rename; no engine is restarted: the
        engines are being stopped), so the next start runs the release that was active
        before. A swap's release still pending on trial is rejected with ``reason``, as
        recovery would reject it as interrupted; one already judged keeps its verdict. With
        nothing to flip back to (the first release of a fresh store), the release stays
        active and pending, to be accepted once its engines are healthy, like a seed.
        """
        if self.active_release() != underway.before:
            try:
                restored = await asyncio.to_thread(self.store.rollback)
                self._step(progress, "rolled_back", release=restored.id)
            except (ReleaseError, OSError) as exc:
                self._step(progress, "rollback_impossible", reason=str(exc))
        trial = underway.trial
        if trial is not None and self.active_release() != trial.id and self._pending(trial):
            await self._judge(trial, ReleaseVerdict.REJECTED, f"cancelled: {reason}", progress)
        if underway.operation is Operation.SWAP:
            self._count(SwapResult.CANCELLED)
        else:
            self._count_rollback(SwapResult.CANCELLED)
        _log.warning("swap_cancelled", operation=underway.operation, reason=reason,
                     release=self.active_release())
        return SwapOutcome(SwapResult.CANCELLED, self.active_release(), underway.before, reason)

    def _pending(self, release: Release) -> bool:
        try:
            record = self.store.verdict(release)
        except (ReleaseError, OSError):
            return False
        return record is not None and record.verdict == ReleaseVerdict.PENDING

    async def _unless_closed(self, wait: Awaitable[T]) -> T:
        """Await ``wait`` -- a wait on engines or on time -- unless :meth:`close` comes first:
        then ``wait`` is cancelled and SwapCancelled raised. Only such waits are cut short:
        a store write always runs to its end, so a cancel never finds the store half-way."""
        task = asyncio.ensure_future(wait)
        if self.closed is not None:
            task.cancel()
            raise SwapCancelled(self.closed)
        self._waiting = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.closed is None or (current is not None and current.cancelling()):
                raise  # cancelled from outside (the loop is being torn down): not ours
            raise SwapCancelled(self.closed) from None
        finally:
            self._waiting = None

    async def _swap(self, source: Path, smoke_args: Sequence[str] | None, smoke_timeout: float,
                    settle: float, progress: Progress, plan: AnalysisPlan | None,
                    underway: _Underway) -> SwapOutcome:
        try:
            self.store.validate_source(source)
            installed = {r.id for r in await asyncio.to_thread(self.store.releases)}
            # Refusals found while copying (the source changed, a full disk) and a
            # failed flip below change nothing the engines run: still a refusal.
            release = await asyncio.to_thread(self.store.install, source)
        except (ReleaseError, OSError) as exc:
            return self.refuse(str(exc))
        #: this swap's own copy (not a release installed before with the same content): a
        #: refusal before its activation removes it
        fresh = release.id not in installed
        self._step(progress, "installed", release=release.id, binary=str(release.binary))
        if smoke_args is not None:
            cause = await self._unless_closed(self.target.run_oneshot(
                [str(release.binary), *smoke_args], smoke_timeout))
            self._step(progress, "smoke_test", release=release.id, cause=cause)
            if cause != "exit_0":
                refusal = f"smoke test {list(smoke_args)} ended with {cause}"
                await self._judge(release, ReleaseVerdict.REJECTED, refusal, progress, trial=True)
                await self._discard(release, fresh, refusal, progress)
                return self.refuse(refusal)
        engines = self.target.engine_names_using_binary()
        before: analysis.Tally | None = None
        if plan is not None and engines and len(engines) <= plan.canary:
            # No engine would stay on the old release to compare with: the canaries'
            # own window on it, before the swap, is the baseline.
            self._step(progress, "analysis_baseline", engines=engines, seconds=plan.seconds)
            before = await self._unless_closed(self._window(engines, plan.seconds))
        try:
            await asyncio.to_thread(self.store.put_in_service, release, ReleaseOrigin.SWAP)
            underway.trial = release
            previous = await asyncio.to_thread(self.store.activate, release)
        except (ReleaseError, OSError) as exc:
            refusal = f"cannot activate release {release.id}: {exc}"
            await self._discard(release, fresh, refusal, progress)
            return self.refuse(refusal)
        self._step(
            progress, "activated", release=release.id,
            previous=previous.id if previous else None,
        )
        report: analysis.CanaryReport | None = None
        if plan is None or not engines:
            moved, reason = await self._roll(engines, settle, progress)
        else:
            canaries, rest = engines[:plan.canary], engines[plan.canary:]
            moved, reason = await self._roll(canaries, settle, progress)
            if reason is None:
                report = await self._analyse(canaries, rest, before, plan, progress)
                reason = _analysis_refusal(report, plan)
            if reason is None:
                more, reason = await self._roll(rest, settle, progress)
                moved += more
        found = None if report is None else report.as_json()
        if reason is None:
            self._count(SwapResult.OK)
            accepted = _healthy(engines, settle) + (
                "" if report is None else f"; {report.summary()}")
            await self._judge(release, ReleaseVerdict.ACCEPTED, accepted, progress,
                              analysis=found)
            _log.info("swap_done", release=release.id, engines=engines)
            await self._prune(progress)
            return SwapOutcome(SwapResult.OK, release.id, previous.id if previous else None, None,
                               engines, found)
        await self._judge(release, ReleaseVerdict.REJECTED, reason, progress, analysis=found)
        outcome = await self._undo(release, previous, moved, reason, settle, progress)
        # once the engines are back (a cancel counts otherwise)
        self._count(SwapResult.ROLLED_BACK)
        return dataclasses.replace(outcome, analysis=found)

    async def _analyse(self, canaries: Sequence[str], rest: Sequence[str],
                       before: analysis.Tally | None, plan: AnalysisPlan,
                       progress: Progress) -> analysis.CanaryReport:
        """Compare the canaries over ``plan.seconds`` with the old engines (``rest``), or
        with their own window before the swap (``before``); the operator's check runs
        meanwhile. The report is streamed, logged and returned."""
        self._step(progress, "analysing", canaries=list(canaries),
                   baseline=analysis.Baseline.SELF if before is not None else list(rest),
                   seconds=plan.seconds)
        windows, check_cause = await self._unless_closed(asyncio.gather(
            self._windows([*canaries, *rest], plan.seconds), self._check(canaries[0], plan)))
        ours = [windows.get(name) for name in canaries]
        kind: analysis.Baseline
        if before is not None:
            baseline, kind = before, analysis.Baseline.SELF
        else:
            baseline = analysis.combine(w for n in rest if (w := windows.get(n)) is not None)
            kind = analysis.Baseline.PEERS
        missing = [name for name, window in zip(canaries, ours, strict=True) if window is None]
        report = analysis.judge(analysis.combine(w for w in ours if w is not None), baseline,
                                plan.criteria, baseline_kind=kind, check=check_cause,
                                unread=missing)
        self._step(progress, "analysis", verdict=report.result, summary=report.summary(),
                   analysis=report.as_json())
        return report

    async def _check(self, canary: str, plan: AnalysisPlan) -> str | None:
        """Run the operator's check against ``canary`` (no shell; ``--analysis`` bounds it);
        its exit cause, None without a check."""
        if plan.check is None:
            return None
        env = {**os.environ, CANARY_ENGINE_ENV: canary,
               CANARY_STATUS_ENV: self.target.engine_status_address(canary) or ""}
        return await self.target.run_oneshot(plan.check, plan.seconds, env)

    async def _window(self, names: Sequence[str], seconds: float) -> analysis.Tally | None:
        """The engines' counters grown over ``seconds``, combined; None without any reading."""
        windows = await self._windows(names, seconds)
        return analysis.combine(windows.values()) if windows else None

    async def _windows(self, names: Sequence[str],
                       seconds: float) -> dict[str, analysis.Tally]:
        """Each engine's counters grown over the same ``seconds``; an engine without two
        readings (no status, restarted in between, removed) is left out."""
        first = await asyncio.gather(*(self._tally(n) for n in names))
        await asyncio.sleep(seconds)
        last = await asyncio.gather(*(self._tally(n) for n in names))
        grown = {name: analysis.growth(a, b) for name, a, b in zip(names, first, last, strict=True)
                 if a is not None and b is not None}
        return {name: window for name, window in grown.items() if window is not None}

    async def _tally(self, name: str) -> analysis.Tally | None:
        try:
            doc, extensions = await self.target.engine_status(name)
        except KeyError:  # removed by a reload meanwhile
            return None
        if doc is None or extensions is None:
            return None
        return analysis.tally_of(doc, extensions)

    async def rollback(self, *, settle: float = 10.0, progress: Progress = _ignore) -> SwapOutcome:
        """Go back to the last accepted release before the active one and roll the engines.

        On success the release left behind is rejected (an operator rolled back from it), so a
        further rollback goes further back. If an engine fails on the target, the target is
        rejected and the rollback undone: ``current`` flips back and the moved engines restart
        on the release that was active before.
        """
        return await self._cancellable(Operation.ROLLBACK, progress,
                                       lambda underway: self._rollback(settle, progress))

    async def _rollback(self, settle: float, progress: Progress) -> SwapOutcome:
        try:
            current = self.store.active()
            target = self.store.rollback_target()
            if current is None or target is None:
                raise ReleaseError(_no_target(current))
            await asyncio.to_thread(self.store.activate, target)
        except (ReleaseError, OSError) as exc:
            self._count_rollback(SwapResult.FAILED)
            _log.warning("swap_rollback_refused", reason=str(exc))
            return SwapOutcome(SwapResult.REFUSED, self.active_release(), None, str(exc))
        self._step(progress, "activated", release=target.id, previous=current.id)
        engines = self.target.engine_names_using_binary()
        moved, reason = await self._roll(engines, settle, progress)
        if reason is None:
            self._count_rollback(SwapResult.OK)
            await self._judge(current, ReleaseVerdict.REJECTED,
                              f"rolled back by `cuzkd swap --rollback` to {target.id}",
                              progress)
            _log.info("swap_rollback_done", release=target.id, replaced=current.id)
            return SwapOutcome(SwapResult.OK, target.id, current.id, None, engines)
        await self._judge(target, ReleaseVerdict.REJECTED, f"rollback to it failed: {reason}",
                          progress)
        failure = await self._flip_back(moved, settle, progress)
        # once the engines are back (a cancel counts otherwise)
        self._count_rollback(SwapResult.FAILED)
        detail = f"{reason}; the rollback was undone"
        if failure is not None:
            detail += f"; {failure}"
        return SwapOutcome(SwapResult.FAILED, self.active_release(), target.id, detail, moved)

    async def accept_when_healthy(self, settle: float, retry: float = ACCEPT_RETRY) -> None:
        """Accept the active release once every ``{binary}`` engine is healthy through settle.

        For a release put into service without a swap's health checks: the ``initial_binary``
        seed, or a release a crash left active mid-swap (both pending). Runs until the active
        release is judged: tries again while an engine is not up, and keeps out of the way
        while a swap runs (the swap judges its own release; if it flips back to a release still
        pending, that one is judged here afterwards). The caller owns the task.
        """
        last_reason: str | None = None
        while True:
            if not self.busy:
                active = self._pending_active()
                if active is None:
                    return
                engines = self.target.engine_names_using_binary()
                reasons = await asyncio.gather(*(self._healthy_or_removed(n, settle)
                                                 for n in engines))
                failures = [r for r in reasons if r is not None]
                # No await from this check to the write: a swap cannot start in between.
                still = None if self.busy else self._pending_active()
                if still is not None and still.id == active.id:
                    if not failures:
                        self._accept(active, engines, settle)
                        return
                    if failures[0] != last_reason:
                        last_reason = failures[0]
                        _log.info("release_not_yet_accepted", release=active.id,
                                  reason=last_reason)
            await asyncio.sleep(retry)

    def _pending_active(self) -> Release | None:
        """The active release if the history has it pending; None otherwise or unreadable."""
        try:
            active = self.store.active()
            record = None if active is None else self.store.verdict(active)
        except (ReleaseError, OSError) as exc:
            _log.error("release_acceptance_skipped", error=str(exc))
            return None
        return active if record is not None and record.verdict == ReleaseVerdict.PENDING else None

    def _accept(self, release: Release, engines: Sequence[str], settle: float) -> None:
        try:
            self.store.judge(release, ReleaseVerdict.ACCEPTED, _healthy(engines, settle))
        except (ReleaseError, OSError) as exc:
            _log.error("swap_history_write_failed", release=release.id, error=str(exc))
            return
        _log.info("release_accepted", release=release.id, engines=list(engines))

    async def _healthy_or_removed(self, name: str, settle: float) -> str | None:
        try:
            reason = await self.target.wait_healthy(name, settle)
        except KeyError:  # removed by a reload meanwhile: nothing left to judge on it
            return None
        return None if reason is None else f"engine {name}: {reason}"

    async def _roll(
        self, engines: Sequence[str], settle: float, progress: Progress
    ) -> tuple[list[str], str | None]:
        """Restart ``engines`` one at a time on the active release until one fails.

        Returns the engines moved (the failing one included) and the failure, or None.
        """
        moved: list[str] = []
        for name in engines:
            moved.append(name)
            reason = await self._restart_one(name, settle, progress)
            if reason is not None:
                return moved, reason
        return moved, None

    async def _undo(
        self,
        release: Release,
        previous: Release | None,
        moved: list[str],
        reason: str,
        settle: float,
        progress: Progress,
    ) -> SwapOutcome:
        if previous is None:
            # Nothing to go back to (the first release of a fresh state dir): leave it active,
            # the engines stay in backoff/failed and the operator sees why.
            self._step(progress, "rollback_impossible", reason=reason)
            return SwapOutcome(SwapResult.FAILED, release.id, None, reason, moved)
        failure = await self._flip_back(moved, settle, progress)
        if failure is not None and self.active_release() == release.id:
            # current still names the new release: the moved engines stay on it.
            return SwapOutcome(SwapResult.FAILED, release.id, previous.id,
                               f"{reason}; {failure}", moved)
        detail = reason if failure is None else f"{reason}; {failure}"
        return SwapOutcome(SwapResult.ROLLED_BACK, previous.id, release.id, detail, moved)

    async def _flip_back(self, moved: Sequence[str], settle: float,
                         progress: Progress) -> str | None:
        """Flip ``current`` back to ``previous`` and restart ``moved`` on it; None, or why not
        every engine came back."""
        try:
            restored = await asyncio.to_thread(self.store.rollback)
        except (ReleaseError, OSError) as exc:
            self._step(progress, "rollback_impossible", reason=str(exc))
            return f"cannot roll back: {exc}"
        self._step(progress, "rolled_back", release=restored.id)
        failure = await self._restart_each(moved, settle, progress)
        return None if failure is None else f"after rollback: {failure}"

    async def _judge(self, release: Release, verdict: ReleaseVerdict, reason: str,
                     progress: Progress, *, trial: bool = False,
                     analysis: dict[str, Any] | None = None) -> None:
        """Record a verdict; a history that cannot be written is reported, never fatal (the
        engines' state is what it is). ``trial`` first records the release as put on trial
        (a release refused before activation)."""
        try:
            if trial:
                await asyncio.to_thread(self.store.put_in_service, release, ReleaseOrigin.SWAP)
            await asyncio.to_thread(self.store.judge, release, verdict, reason, analysis)
        except (ReleaseError, OSError) as exc:
            _log.error("swap_history_write_failed", release=release.id, error=str(exc))
            self._step(progress, "history_not_saved", release=release.id, reason=str(exc))
            return
        self._step(progress, verdict, release=release.id)

    async def _discard(self, release: Release, fresh: bool, reason: str,
                       progress: Progress) -> None:
        """Remove the release a refused swap installed (``fresh``) and never activated: left
        in ``releases/`` it would only take the space (see :meth:`ReleaseStore.discard`).
        Failing to is reported, never fatal: the next start discards it."""
        if not fresh:
            return
        try:
            if await asyncio.to_thread(self.store.discard, release, reason):
                self._step(progress, "discarded", release=release.id)
        except (ReleaseError, OSError) as exc:
            _log.error("swap_discard_failed", release=release.id, error=str(exc))

    async def _prune(self, progress: Progress) -> None:
        try:
            removed = await asyncio.to_thread(self.store.prune, self.keep_releases)
        except (ReleaseError, OSError) as exc:
            _log.error("swap_prune_failed", error=str(exc))
            return
        if removed:
            self._step(progress, "pruned", releases=[r.id for r in removed])

    async def _restart_each(
        self, names: Sequence[str], settle: float, progress: Progress
    ) -> str | None:
        """Restart engines in order; return the first failure reason, if any."""
        _, reason = await self._roll(names, settle, progress)
        return reason

    async def _restart_one(self, name: str, settle: float, progress: Progress) -> str | None:
        self._step(progress, "restarting", engine=name)
        try:
            reason = await self._unless_closed(self._restarted_healthy(name, settle))
        except KeyError:
            # A reload removed the engine while the swap was rolling: nothing left to move.
            self._step(progress, "skipped", engine=name, reason="engine removed by a reload")
            return None
        if reason is None:
            self._step(progress, "healthy", engine=name)
            return None
        self._step(progress, "unhealthy", engine=name, reason=reason)
        return f"engine {name}: {reason}"

    async def _restarted_healthy(self, name: str, settle: float) -> str | None:
        await self.target.restart_engine(name, swap=True)
        return await self.target.wait_healthy(name, settle)

    def _exclusive(self) -> asyncio.Lock:
        if self._lock.locked():
            raise SwapInProgress("a swap is already in progress")
        return self._lock

    def _count(self, result: SwapResult) -> None:
        self.counts[result] += 1

    def _count_rollback(self, result: SwapResult) -> None:
        self.rollback_counts[result] += 1

    @staticmethod
    def _step(progress: Progress, step: str, **fields: Any) -> None:
        _log.info("swap_step_reached", step=step, **fields)
        progress({"event": step, **fields})


def _analysis_refusal(report: analysis.CanaryReport, plan: AnalysisPlan) -> str | None:
    """Why the swap cannot go on after the analysis; None to move the rest."""
    if report.result is analysis.AnalysisResult.PASS or (
            report.result is analysis.AnalysisResult.INCONCLUSIVE
            and plan.on_inconclusive == OnInconclusive.PROCEED):
        return None
    return f"canary {report.summary()}"


def _healthy(engines: Sequence[str], settle: float) -> str:
    return f"{len(engines)} engine(s) healthy through the {settle:g}s settle period"


def _no_target(current: Release | None) -> str:
    if current is None:
        return "no active release to roll back from"
    return (f"no accepted release before the active one ({current.id}) to roll back to; "
            "`cuzkd swap --history` lists the releases and their verdicts")
