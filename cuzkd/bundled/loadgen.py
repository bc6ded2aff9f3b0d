"""``cuzkd bench``: submit jobs to an engine, wait for them, report throughput and busy time.

The GPU-busy fraction is Σ worker busy seconds / (wall × workers), from the cumulative
``cuzkd_extensions.worker_busy`` totals sampled before the first submission and after the last
job finished -- exact, unlike sampling worker states. Against a plain cuzk (no extensions) it is
reported as unavailable.

Polling is cheap on purpose: jobs finish roughly first-in first-out, so each round asks for
``/status`` (the progress bar) and then only for jobs up to the first one still unfinished.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import aiohttp

from cuzkd.bundled.jobs import JobState
from cuzkd.errors import BenchError
from cuzkd.status.document import StatusDocument, decode_status

POLL_INTERVAL_SECS = 0.2


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float


@dataclass(frozen=True)
class BenchReport:
    jobs: int
    jobs_done: int
    jobs_failed: int
    proofs_verified: int
    partitions: int
    wall_secs: float
    partitions_per_sec: float
    synth_secs: Percentiles | None
    gpu_secs: Percentiles | None
    workers: int
    gpu_busy_fraction: float | None
    errors: list[str]

    @property
    def ok(self) -> bool:
        return self.jobs_done == self.jobs and self.proofs_verified == self.jobs

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def to_text(self) -> str:
        def pct(name: str, p: Percentiles | None) -> str:
            if p is None:
                return f"{name}: no samples"
            return f"{name}: p50 {p.p50:.4f} s  p90 {p.p90:.4f} s  p99 {p.p99:.4f} s"

        busy = ("n/a (engine serves no cuzkd_extensions)" if self.gpu_busy_fraction is None
                else f"{self.gpu_busy_fraction:.3f} ({self.workers} workers)")
        lines = [
            f"jobs: {self.jobs_done} done, {self.jobs_failed} failed of {self.jobs}; "
            f"proofs verified: {self.proofs_verified}/{self.jobs}",
            f"wall: {self.wall_secs:.3f} s; throughput: {self.partitions_per_sec:.2f} "
            f"partitions/s ({self.partitions} partitions)",
            pct("synthesis", self.synth_secs),
            pct("gpu phase", self.gpu_secs),
            f"gpu-busy fraction: {busy}",
            *(f"error: {e}" for e in self.errors),
        ]
        return "\n".join(lines)


def percentiles(values: Sequence[float]) -> Percentiles | None:
    """Nearest-rank percentiles (no interpolation: every figure is an observed value)."""
    if not values:
        return None
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return Percentiles(p50=rank(0.50), p90=rank(0.90), p99=rank(0.99))


def busy_fraction(before: StatusDocument, after: StatusDocument,
                  wall_secs: float) -> tuple[float | None, int]:
    if before.cuzkd_extensions is None or after.cuzkd_extensions is None:
        return None, len(after.gpu_workers)
    start = {w.worker_id: w.busy_seconds_total for w in before.cuzkd_extensions.worker_busy}
    end = after.cuzkd_extensions.worker_busy
    busy = sum(w.busy_seconds_total - start.get(w.worker_id, 0.0) for w in end)
    if not end or wall_secs <= 0:
        return None, len(end)
    return busy / (wall_secs * len(end)), len(end)


def _session(engine: str) -> tuple[aiohttp.ClientSession, str]:
    """A session and base URL for ``http://HOST:PORT`` or ``unix:PATH``."""
    if engine.startswith("unix:"):
        connector = aiohttp.UnixConnector(path=engine.removeprefix("unix:"))
        return aiohttp.ClientSession(connector=connector), "http://engine"
    base = engine if "://" in engine else f"http://{engine}"
    return aiohttp.ClientSession(), base.rstrip("/")


async def _json(response: aiohttp.ClientResponse) -> Any:
    body = await response.read()
    if response.status >= 400:
        raise BenchError(f"{response.method} {response.url.path}: HTTP {response.status}: "
                         f"{body.decode(errors='replace')[:500]}")
    return json.loads(body)


def _progress(out: TextIO, done: int, total: int, started: float) -> None:
    width = 30
    filled = width * done // max(1, total)
    out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} partitions "
              f"{time.monotonic() - started:6.1f} s")
    out.flush()


async def run_bench(engine: str, *, jobs: int, kind: str, partitions: int | None = None,
                    size_log2: int | None = None, timeout_secs: float = 600.0,
                    progress: TextIO | None = sys.stderr) -> BenchReport:
    session, base = _session(engine)
    async with session:
        async def status() -> StatusDocument:
            async with session.get(f"{base}/status") as response:
                if response.status != 200:
                    raise BenchError(f"GET /status: HTTP {response.status}")
                return decode_status(await response.read())

        request: dict[str, Any] = {"proof_kind": kind}
        if partitions is not None:
            request["partitions"] = partitions
        if size_log2 is not None:
            request["size_log2"] = size_log2
        before = await status()
        started = time.monotonic()
        ids: list[str] = []
        for _ in range(jobs):
            async with session.post(f"{base}/v1/jobs", json=request) as response:
                ids.append((await _json(response))["job_id"])
        finished: dict[str, dict[str, Any]] = {}
        deadline = started + timeout_secs
        while len(finished) < len(ids):
            if time.monotonic() > deadline:
                raise BenchError(f"{len(ids) - len(finished)} jobs unfinished after "
                                 f"{timeout_secs:.0f} s")
            doc = await status()
            for job_id in ids:
                if job_id in finished:
                    continue
                async with session.get(f"{base}/v1/jobs/{job_id}") as response:
                    view = await _json(response)
                if view["state"] not in (JobState.DONE, JobState.FAILED):
                    break
                finished[job_id] = view
            if progress is not None:
                ours = set(ids) - set(finished)
                running = sum(p.partitions_done for p in doc.pipelines if p.job_id in ours)
                finished_parts = sum(v["partitions"] for v in finished.values())
                expected = finished_parts + sum(
                    p.total_partitions for p in doc.pipelines if p.job_id in ours)
                _progress(progress, finished_parts + running, expected, started)
            if len(finished) < len(ids):
                await asyncio.sleep(POLL_INTERVAL_SECS)
        wall = time.monotonic() - started
        after = await status()
    if progress is not None:
        progress.write("\n")
    views = [finished[job_id] for job_id in ids]
    done = [v for v in views if v["state"] == JobState.DONE]
    total_partitions = sum(v["partitions"] for v in done)
    synth = [s for v in done for s in v["timings"]["synth_secs"] if s is not None]
    gpu = [s for v in done for s in v["timings"]["gpu_secs"] if s is not None]
    fraction, workers = busy_fraction(before, after, wall)
    return BenchReport(
        jobs=len(views),
        jobs_done=len(done),
        jobs_failed=len(views) - len(done),
        proofs_verified=sum(1 for v in done if v.get("verified")),
        partitions=total_partitions,
        wall_secs=wall,
        partitions_per_sec=total_partitions / wall if wall > 0 else 0.0,
        synth_secs=percentiles(synth),
        gpu_secs=percentiles(gpu),
        workers=workers,
        gpu_busy_fraction=fraction,
        errors=sorted({v["error"] for v in views if v.get("error")}),
    )
