"""``cuzkd upgrade``: the supervisor re-executes the cuzkd now installed, in place, keeping its
engines, its door process, its listeners and its counts.

``POST /v1/upgrade`` runs the gate (:mod:`~cuzkd.supervisor.core.upgradegate`) and the new
program's dry run (:func:`~cuzkd.supervisor.proc.reexec.dry_run`); either refusal changes
nothing and is answered at once (409: not now; 422: the new program refuses). With ``check``
that is all. Otherwise the answer is 202 with the upgrade's id, and the exec follows once the
answer has left: the metrics listener stops accepting and its responses in flight end
(:data:`QUIESCE` at most), the hand-over is taken, the gate asked again, ``RELOADING=1`` sent,
the log flushed (:data:`LOG_FLUSH` at most: what is still queued is counted dropped), and the
program replaced. From the hand-over's last line to the exec nothing yields to the loop, so the
hand-over is the state the new code finds. The new code answers ``GET /v1/upgrade`` with the
outcome, which is how ``cuzkd upgrade`` learns it (its connection ended with the old code).
See docs/operations.md, *Upgrading cuzkd in place*.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

import msgspec
import structlog
from aiohttp import web

from cuzkd import __version__
from cuzkd.httperrors import error_response
from cuzkd.log.queue import DropReason
from cuzkd.metrics.carry import CarriedSample
from cuzkd.states import Phase, UpgradeResult
from cuzkd.supervisor.core.handover import Handover, Verdict, encode
from cuzkd.supervisor.core.phase import SupervisorPhase
from cuzkd.supervisor.daemon.notify import Notifier
from cuzkd.supervisor.proc.reexec import block_signals, current_signal_mask, restore_signals

log = structlog.get_logger("cuzkd.supervisor")

#: How long the new program's dry run may take (it imports cuzkd and reads the config).
DRY_RUN_TIMEOUT = 60.0
#: How long the metrics responses in flight get to end before the exec.
QUIESCE = 1.0
#: How long the log's queued lines get to be written before the exec.
LOG_FLUSH = 1.0
#: The series the lines still queued at the exec are counted in.
_DROPPED = ("cuzkd_log_lines_dropped_total", {"reason": DropReason.UPGRADE.value})


@dataclass(frozen=True)
class UpgradeOutcome:
    """How an upgrade ended."""

    id: str
    outcome: UpgradeResult
    old: str
    new: str | None
    at: float
    error: str | None = None
    #: the supervision gap: the old code's last decision to the new code's first
    gap_seconds: float | None = None


class Program(Protocol):
    """The new program (:class:`~cuzkd.supervisor.proc.reexec.InstalledProgram`)."""

    @property
    def name(self) -> str: ...

    async def check(self, handover: bytes, timeout: float) -> Verdict: ...

    def replace(self, handover: bytes, keep: Sequence[int]) -> OSError: ...


class Upgrader:
    """The upgrade's control routes and its steps; the supervisor gives it what it needs."""

    def __init__(self, phase: SupervisorPhase, notifier: Notifier, program: Program, *,
                 refusal: Callable[[Phase], str | None],
                 handover: Callable[[str, list[int]], Awaitable[Handover]],
                 quiesce: Callable[[float], Awaitable[None]],
                 resume: Callable[[], Awaitable[None]],
                 flush_log: Callable[[float], int], status_line: Callable[[], str]) -> None:
        """``command``: runs the cuzkd installed where this one was started from;
        ``exec_args``: ``cuzkd run``'s own options to keep (``--log-format``); ``refusal``:
        why not now (the gate); ``handover``: the hand-over for an upgrade id and a signal
        mask; ``quiesce``/``resume``: the metrics listener held for the exec, or accepting
        again; ``flush_log``: writes the queued log within a bound, returns the lines left."""
        self._phase = phase
        self._notifier = notifier
        self._program = program
        self._refusal = refusal
        self._handover = handover
        self._quiesce = quiesce
        self._resume = resume
        self._flush_log = flush_log
        self._status_line = status_line
        #: the last upgrade's outcome (``GET /v1/upgrade``)
        self.last: UpgradeOutcome | None = None

    def routes(self) -> Callable[[web.Application], None]:
        """``POST /v1/upgrade`` (body ``{"check": true}``: the dry run only) and
        ``GET /v1/upgrade`` (the last upgrade's outcome)."""
        async def post(request: web.Request) -> web.StreamResponse:
            try:
                body = await request.json() if request.can_read_body else {}
            except ValueError as exc:
                return error_response(400, f"the body is not JSON: {exc}")
            if not isinstance(body, dict) or not isinstance(body.get("check", False), bool):
                return error_response(400, 'the body is {"check": true|false} or nothing')
            return await self.request(request, body.get("check", False))

        async def get(request: web.Request) -> web.Response:
            del request
            return web.json_response({"version": __version__,
                                      "last": None if self.last is None else asdict(self.last)})

        def hook(app: web.Application) -> None:
            app.router.add_post("/v1/upgrade", post)
            app.router.add_get("/v1/upgrade", get)

        return hook

    async def request(self, request: web.Request, check: bool) -> web.StreamResponse:
        """Refused (409, 422), checked (200), or accepted (202, sent whole) and carried out."""
        why = self._refusal(self._phase.phase)
        if why is not None:
            return error_response(409, f"upgrade refused: {why}")
        self._phase.begin_upgrade()
        upgrade_id = secrets.token_hex(8)
        try:
            handover = await self._handover(upgrade_id, current_signal_mask())
            verdict = await self._program.check(encode(handover), DRY_RUN_TIMEOUT)
        except BaseException:
            self._phase.end_upgrade()
            raise
        if not verdict.ok or check:
            self._phase.end_upgrade()
        if not verdict.ok:
            log.warning("supervisor_upgrade_refused", error=verdict.reason,
                        program=self._program.name)
            return error_response(422, f"upgrade refused by the new program: {verdict.reason}")
        answer = {"id": upgrade_id, "old": __version__, "new": verdict.version,
                  "program": self._program.name, "check": check}
        if check:
            return web.json_response(answer)
        response = web.Response(status=202, body=msgspec.json.encode(answer),
                                content_type="application/json")
        await response.prepare(request)
        await response.write_eof()  # it has left: the connection ends with this program
        # shielded: a client that goes away must not cancel it halfway (signals blocked)
        await asyncio.shield(self._exec(upgrade_id, verdict.version))
        return response

    async def _exec(self, upgrade_id: str, new: str) -> None:
        """Hold the listeners and exec (see module doc); returns only when it did not."""
        await self._quiesce(QUIESCE)
        # Blocked from here: a signal now waits for the new code. One that came just before
        # is in the loop's hands: two turns of the loop handle it (a stop ends the upgrade).
        mask = block_signals()
        try:
            outcome = await self._exec_blocked(upgrade_id, new, mask)
        except Exception as exc:  # whatever broke, the old code must run on as it was
            outcome = UpgradeOutcome(upgrade_id, UpgradeResult.FAILED, __version__, new,
                                     time.time(), f"{type(exc).__name__}: {exc}")
        finally:
            restore_signals(mask)
        await self._undo(outcome, send_ready=outcome.outcome is UpgradeResult.FAILED)

    async def _exec_blocked(self, upgrade_id: str, new: str, mask: list[int]) -> UpgradeOutcome:
        """The steps with every signal blocked; how it ended when the exec did not happen."""
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        handover = await self._handover(upgrade_id, mask)
        # the moment, asked again: while this program was upgrading, not since
        why = ("the supervisor is stopping" if self._phase.stopping
               else self._refusal(Phase.RUNNING))
        if why is not None:
            return UpgradeOutcome(upgrade_id, UpgradeResult.REFUSED, __version__, new,
                                  time.time(), why)
        self._notifier.reloading()
        log.info("supervisor_upgrading", old=__version__, new=new, upgrade_id=upgrade_id,
                 program=self._program.name, engines=len(handover.engines))
        unwritten = self._flush_log(LOG_FLUSH)
        handover = msgspec.structs.replace(
            handover, handed_at=time.monotonic(), samples=_count_dropped(handover.samples,
                                                                         unwritten))
        error = self._program.replace(encode(handover), handover.descriptors())
        return UpgradeOutcome(upgrade_id, UpgradeResult.FAILED, __version__, new, time.time(),
                              f"exec {self._program.name}: {error}")

    async def _undo(self, outcome: UpgradeOutcome, *, send_ready: bool) -> None:
        """The exec did not happen: carry on as before, the outcome logged and kept."""
        self.last = outcome
        log.error("supervisor_upgrade_failed", error=outcome.error, outcome=outcome.outcome,
                  upgrade_id=outcome.id)
        self._phase.end_upgrade()
        await self._resume()
        if send_ready and not self._phase.stopping:
            self._notifier.send("READY=1", self._status_line())

    def adopted(self, handover: Handover, gap: float) -> None:
        """This program took over (the new code's side): say so, once."""
        self.last = UpgradeOutcome(handover.upgrade_id, UpgradeResult.UPGRADED,
                                   handover.version, __version__, time.time(),
                                   gap_seconds=round(gap, 6))
        log.info("supervisor_upgraded", old=handover.version, new=__version__,
                 upgrade_id=handover.upgrade_id, gap_seconds=round(gap, 3),
                 engines=len(handover.engines))


def _count_dropped(samples: list[CarriedSample], lines: int) -> list[CarriedSample]:
    """``samples`` with ``lines`` more in ``cuzkd_log_lines_dropped_total{reason="upgrade"}``."""
    if not lines:
        return samples
    name, labels = _DROPPED
    return [msgspec.structs.replace(s, value=s.value + lines)
            if s.name == name and s.labels == labels else s for s in samples]
