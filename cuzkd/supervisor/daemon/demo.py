"""``cuzkd run --demo``: a job load shaped like production, so every dashboard moves.

:class:`BurstShape` is the pure decision for one engine, fed the engine's clock and finished
job count: a burst of jobs of every kind, then an idle gap as long as the burst took, give or
take half. :func:`drive` is the I/O loop. An engine behind a front door gets its jobs as Curio
sends them, one gRPC ``Prove`` each with Curio's priority (:data:`PRIORITIES`), and its finished
count is the demo's own count of returned Prove calls, since a call the door refused moves no
/status counter; an engine without a door gets ``POST /v1/jobs``. The shape is in
docs/operations.md, *The dashboards, panel by panel*.
The door's side is docs/door.md, *A bundled engine's seat*.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp
import grpc
import structlog

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.kinds import ENUM_KINDS, ProofKind
from cuzkd.priority import Priority
from cuzkd.status.client import StatusSource, split_address

log = structlog.get_logger("cuzkd.demo")

SECTOR_KINDS = (ProofKind.SNAP_UPDATE, ProofKind.POREP_C2)
POST_KINDS = (ProofKind.WINDOW_POST, ProofKind.WINNING_POST)
#: Sector jobs per burst beyond the first (each snap-update or porep-c2 at random).
EXTRA_SECTOR_JOBS = (0, 2)
GAP_FACTOR = (0.5, 1.5)
#: Shortest idle gap, seconds: a burst of one small job still leaves a visible gap.
MIN_GAP = 2.0
#: Longest gap, seconds: a burst slowed by a loaded machine does not stop the demo for long.
MAX_GAP = 60.0
#: Seconds between two looks at each engine.
PERIOD = 0.5
#: Curio's priority for each kind's Prove: a WinningPoSt missed loses a block reward, a
#: WindowPoSt missed a sector's power; sector proofs wait.
PRIORITIES: Mapping[str, Priority] = {
    ProofKind.WINNING_POST: Priority.CRITICAL, ProofKind.WINDOW_POST: Priority.HIGH,
    ProofKind.SNAP_UPDATE: Priority.NORMAL, ProofKind.POREP_C2: Priority.NORMAL}
#: The gRPC enum name of each kind a burst names (``POREP_SEAL_COMMIT``, ...).
ENUMS: Mapping[str, str] = {kind: pb.ProofKind.Name(number)
                            for number, kind in ENUM_KINDS.items()}
#: Longest a demo Prove may take, seconds: far beyond a demo proof or a restart's hold, so it
#: only ends a call that nothing will answer.
PROVE_TIMEOUT = 600.0


@dataclass
class BurstShape:
    """When to submit what to one engine: bursts of mixed jobs, then gaps as long as a burst.

    ``finished`` is the engine's count of finished jobs (completed + failed, from its status
    document's counters); a count lower than at the burst's start means the engine restarted,
    which ends the burst (its jobs are gone).
    """

    rng: random.Random
    #: while bursting: (start time, finished count at start, jobs submitted); else None
    burst: tuple[float, int, int] | None = None
    idle_until: float = 0.0
    bursts: int = 0

    def next_burst(self, now: float, finished: int) -> list[str] | None:
        """The kinds to submit now, or None while a burst runs or a gap lasts."""
        if self.burst is not None:
            started, baseline, submitted = self.burst
            if baseline <= finished < baseline + submitted:
                return None
            took = now - started
            gap = min(MAX_GAP, max(MIN_GAP, took * self.rng.uniform(*GAP_FACTOR)))
            self.burst = None
            self.idle_until = now + gap
        if now < self.idle_until:
            return None
        turn = self.bursts % 2
        self.bursts += 1
        extra = self.rng.choices(SECTOR_KINDS, k=self.rng.randint(*EXTRA_SECTOR_JOBS))
        return [SECTOR_KINDS[turn], *extra, POST_KINDS[turn]]

    def submitted(self, now: float, finished: int, jobs: int) -> None:
        """Record that ``jobs`` of the burst were accepted (0: try again after a gap)."""
        if jobs:
            self.burst = (now, finished, jobs)
        else:
            self.idle_until = now + MIN_GAP


class DoorCaller:
    """Curio's way in to one engine: concurrent ``Prove`` calls through its front door."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = grpc.aio.insecure_channel(address)  # a demo proof's reply is small
        self._prove = self._channel.unary_unary(
            "/cuzk.v1.ProvingEngine/Prove",
            request_serializer=pb.ProveRequest.SerializeToString,
            response_deserializer=pb.ProveResponse.FromString)
        #: Prove calls that returned, whatever their outcome: the burst's finished count
        self.finished = 0
        self._calls: set[asyncio.Task[None]] = set()
        #: request ids unique to this caller, as Curio's are (a reused id joins a job)
        self._ids = itertools.count()
        self._prefix = f"demo-{os.getpid()}-{id(self):x}"

    def prove(self, kinds: Sequence[str]) -> list[asyncio.Task[None]]:
        """Start one Prove per kind, all at once (each ends counted in :attr:`finished`)."""
        started = [asyncio.create_task(self._call(kind)) for kind in kinds]
        for task in started:
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        return started

    async def _call(self, kind: str) -> None:
        request = pb.ProveRequest(submit=pb.SubmitProofRequest(
            request_id=f"{self._prefix}-{next(self._ids)}", proof_kind=ENUMS[kind],
            priority=PRIORITIES[kind].name))
        try:
            reply = await self._prove(request, timeout=PROVE_TIMEOUT)
            if reply.result.status != pb.AwaitProofResponse.COMPLETED:
                log.debug("demo_job_refused", status=reply.result.status, url=self.address)
        except grpc.aio.AioRpcError as exc:
            log.debug("demo_job_failed", error=f"{exc.code().name}: {exc.details()}",
                      url=self.address)
        finally:
            self.finished += 1

    async def close(self) -> None:
        for task in list(self._calls):
            task.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
        await self._channel.close()


async def drive(targets: Callable[[], Sequence[tuple[StatusSource, str | None]]], *,
                rng: random.Random | None = None) -> None:
    """Run until cancelled. ``targets``: each bundled engine's status source and its door's
    address (None: no door, jobs go to its HTTP API)."""
    rng = rng or random.Random()
    shapes: dict[str, BurstShape] = {}
    sessions: dict[str, aiohttp.ClientSession] = {}
    callers: dict[str, DoorCaller] = {}
    timeout = aiohttp.ClientTimeout(total=2)
    loop = asyncio.get_running_loop()
    try:
        while True:
            for source, door in targets():
                doc = await source.fetch(max_age=PERIOD)
                if doc is None:
                    continue
                now = loop.time()
                caller = None
                if door is not None:
                    caller = callers.get(door)
                    if caller is None:
                        caller = callers[door] = DoorCaller(door)
                    finished = caller.finished
                else:
                    completed, failed = doc.counters.total_completed, doc.counters.total_failed
                    if completed is None or failed is None:
                        continue  # bursts are paced on finished jobs: none without their count
                    finished = completed + failed
                shape = shapes.setdefault(source.address, BurstShape(random.Random(rng.random())))
                kinds = shape.next_burst(now, finished)
                if kinds is None:
                    continue
                if caller is not None:
                    shape.submitted(now, finished, len(caller.prove(kinds)))
                    continue
                session = sessions.get(source.address)
                if session is None:
                    session = sessions[source.address] = _session(source.address, timeout)
                accepted = await _submit(session, _jobs_url(source.address), kinds)
                shape.submitted(now, finished, accepted)
            await asyncio.sleep(PERIOD)
    finally:
        for caller in callers.values():
            await caller.close()
        for session in sessions.values():
            await session.close()


async def _submit(session: aiohttp.ClientSession, url: str, kinds: Sequence[str]) -> int:
    """POST one job per kind; how many the engine accepted."""
    accepted = 0
    for kind in kinds:
        try:
            async with session.post(url, json={"proof_kind": kind}) as resp:
                if resp.status >= 400:
                    log.debug("demo_job_refused", status=resp.status, url=url)
                    continue
                accepted += 1
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.debug("demo_job_failed", error=str(exc), url=url)
            break
    return accepted


def _session(status_address: str, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
    path, _ = split_address(status_address)
    connector = aiohttp.UnixConnector(path=path) if path else None
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


def _jobs_url(status_address: str) -> str:
    _, url = split_address(status_address)
    return url.removesuffix("/status") + "/v1/jobs"
