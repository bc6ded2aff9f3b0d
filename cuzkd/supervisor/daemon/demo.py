"""``cuzkd run --demo``: a job load shaped like production, so every dashboard moves.

A proving host does not see a steady trickle: sectors arrive in batches, the engine works
through a burst, then idles until the next one, and WindowPoSt and WinningPoSt proofs come in
between. A steady load kept every worker busy all the time, so the busy gauges, the budget and
the synthesis panels were flat lines. Here each bundled engine gets, in turn:

* a **burst** of 2-4 jobs submitted at once: 1-3 sector jobs (snap-update or porep-c2; the
  first alternates between the two) and one PoSt (window-post and winning-post in turn), so any
  two bursts in a row hold every kind. The engine gives each kind its real partition count
  (16, 10, 1, 1);
* once the engine has finished as many jobs as the burst submitted, an **idle gap** as long as
  the burst took, times a random factor in [0.5, 1.5] (at least ``MIN_GAP``), so each worker is
  busy about half of the time whatever the machine's speed.

:class:`BurstShape` is the pure decision for one engine (fed the engine's clock and finished
job count, tested directly); :func:`drive` is the I/O loop. Engines that do not answer
(starting, restarting) are skipped until they do, a restarted engine ends its burst: the demo
never fails the supervisor. The bundled engines run as ``cuzkd engine --demo``, whose small
budget the bursts fill and whose synthesis costs as much as proving.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp
import structlog

from cuzkd.kinds import ProofKind
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


async def drive(sources: Callable[[], Sequence[StatusSource]], *,
                rng: random.Random | None = None) -> None:
    """Run until cancelled."""
    rng = rng or random.Random()
    shapes: dict[str, BurstShape] = {}
    sessions: dict[str, aiohttp.ClientSession] = {}
    timeout = aiohttp.ClientTimeout(total=2)
    loop = asyncio.get_running_loop()
    try:
        while True:
            for source in sources():
                doc = await source.fetch(max_age=PERIOD)
                if doc is None:
                    continue
                now = loop.time()
                completed, failed = doc.counters.total_completed, doc.counters.total_failed
                if completed is None or failed is None:
                    continue  # bursts are paced on finished jobs: none without their count
                finished = completed + failed
                shape = shapes.setdefault(source.address, BurstShape(random.Random(rng.random())))
                kinds = shape.next_burst(now, finished)
                if kinds is None:
                    continue
                session = sessions.get(source.address)
                if session is None:
                    session = sessions[source.address] = _session(source.address, timeout)
                accepted = await _submit(session, _jobs_url(source.address), kinds)
                shape.submitted(now, finished, accepted)
            await asyncio.sleep(PERIOD)
    finally:
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
