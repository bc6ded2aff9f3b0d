"""``cuzkd run --demo``: keep every bundled engine busy so all metrics move within seconds.

A steady trickle of ``POST /v1/jobs`` (mostly ``snap``, now and then another kind) keeps about
``queue_depth`` jobs in flight per engine, using the engine's own ``jobs_in_flight`` extension
to decide when to submit. Engines that do not answer (starting, restarting) are skipped until
they do: the demo never fails the supervisor.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence

import aiohttp
import structlog

from cuzkd.status.client import StatusSource, split_address

log = structlog.get_logger("cuzkd.demo")

KINDS = ("snap", "snap", "snap", "porep", "snap", "wpost")


async def drive(sources: Callable[[], Sequence[StatusSource]], *, queue_depth: int = 2,
                period: float = 0.5) -> None:
    """Run until cancelled."""
    kinds = itertools.cycle(KINDS)
    sessions: dict[str, aiohttp.ClientSession] = {}
    timeout = aiohttp.ClientTimeout(total=2)
    try:
        while True:
            for source in sources():
                doc = await source.fetch(max_age=period)
                if doc is None or doc.cuzkd_extensions is None:
                    continue
                missing = queue_depth - doc.cuzkd_extensions.jobs_in_flight
                if missing <= 0:
                    continue
                session = sessions.get(source.address)
                if session is None:
                    path, _ = split_address(source.address)
                    connector = aiohttp.UnixConnector(path=path) if path else None
                    session = aiohttp.ClientSession(connector=connector, timeout=timeout)
                    sessions[source.address] = session
                url = _jobs_url(source.address)
                for _ in range(missing):
                    try:
                        async with session.post(url, json={"proof_kind": next(kinds)}) as resp:
                            if resp.status >= 400:
                                log.debug("demo_job_refused", status=resp.status, url=url)
                    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                        log.debug("demo_job_failed", error=str(exc), url=url)
                        break
            await asyncio.sleep(period)
    finally:
        for session in sessions.values():
            await session.close()


def _jobs_url(status_address: str) -> str:
    _, url = split_address(status_address)
    return url.removesuffix("/status") + "/v1/jobs"
