"""The pipeline in-process: jobs complete and verify, the budget bounds concurrency, oversize
jobs fail alone, draining finishes every accepted job or fails it with "drain timeout"."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support.bundled_inprocess import K, make_engine

from cuzkd.bundled import prover
from cuzkd.bundled.drain import DRAIN_TIMEOUT
from cuzkd.bundled.jobs import INJECTED_FAILURE, Job
from cuzkd.bundled.pipeline import Engine
from cuzkd.errors import EngineDrainingError, JobRequestError
from cuzkd.priority import Priority
from cuzkd.status.document import Buffers, StatusDocument, encode_status

RSS_CHILD = Path(__file__).with_name("engine_rss_child.py")
#: What a busy engine keeps resident beyond its budget: thread stacks, allocator slack, NumPy's
#: small buffers. Fixed: it does not grow with the partition size.
RSS_OVERHEAD = 64 * 2**20


def budget_for(partitions: int, log_n: int = K) -> int:
    """Room for ``partitions`` partitions of 2^log_n at once, plus the NTT tables they pin."""
    return (partitions * sum(prover.partition_bytes(log_n)) + prover.table_bytes(log_n)
            + prover.table_bytes(log_n + 1))


@pytest.fixture
async def engine_factory() -> AsyncIterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def factory(budget_bytes: int, nominal_log2: int = K) -> Engine:
        engine = make_engine(budget_bytes, nominal_log2)
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        await engine.close()


async def wait_jobs(engine: Engine, jobs: list[Job], *,
                    on_poll: Callable[[StatusDocument], None] | None = None,
                    timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(job.finished_at is None for job in jobs):
        if on_poll is not None:
            engine.refresh_status()
            on_poll(engine.tracker.snapshot())
        assert time.monotonic() < deadline, "jobs did not finish"
        await asyncio.sleep(0.002)


async def test_jobs_complete_and_every_proof_verifies(
        engine_factory: Callable[..., Engine],
        cuzk_field_errors: Callable[[bytes], list[str]]) -> None:
    engine = engine_factory(2**30)
    await engine.start()
    jobs = [engine.submit("snap-update", size_log2=K), engine.submit("porep-c2", 3, K),
            engine.submit("winning-post", size_log2=K - 2)]
    docs: list[StatusDocument] = []
    await wait_jobs(engine, jobs, on_poll=docs.append)
    for job in jobs:
        assert job.state == "done", job.error
        assert all(job.verified)
        assert all(prover.verify(p) for p in job.proofs if p is not None)
        assert None not in job.synth_secs and None not in job.gpu_secs
    # allocations are sampled, not evented: the last poll may predate the tables being built
    engine.refresh_status()
    final = engine.tracker.snapshot()
    assert final.counters.completed_by_kind == {"snap-update": 1, "porep-c2": 1, "winning-post": 1}
    # only the cached NTT tables stay held: sizes K-2 .. K+1 on the one CPU device
    assert final.memory.used_bytes == engine.budget.pinned_bytes() == sum(
        prover.table_bytes(log_n) for log_n in range(K - 2, K + 2))
    assert final.buffers.pending_handles == 0
    extensions = final.cuzkd_extensions
    assert extensions is not None and extensions.backend == "numpy"
    assert extensions.phase_transitions["snap-update"]["done"] == 16
    assert sum(w.busy_seconds_total for w in extensions.worker_busy) > 0
    assert {a.circuit_id for a in final.allocations.srs} >= {f"snap-update-2^{K}@0"}
    assert all(a.bytes > 0 for a in final.allocations.srs)
    # gauges were fed while running
    assert any(d.buffers.synth_in_flight or d.buffers.provers_in_flight for d in docs)
    for doc in docs:
        assert cuzk_field_errors(encode_status(doc)) == []


async def test_a_critical_job_is_admitted_before_normal_ones_submitted_earlier(
        engine_factory: Callable[..., Engine]) -> None:
    """cuzk's priorities: a WinningPoSt (CRITICAL) does not wait behind queued PoRep work."""
    engine = engine_factory(budget_for(2))
    await engine.start()
    normal = [engine.submit("snap-update", partitions=2, size_log2=K) for _ in range(3)]
    critical = engine.submit("winning-post", size_log2=K, priority=Priority.CRITICAL)
    await asyncio.wait_for(asyncio.gather(*(j.finished.wait() for j in [*normal, critical])), 30)
    assert critical.state == "done" and critical.started_at is not None
    assert all(job.started_at is not None and critical.started_at < job.started_at
               for job in normal)


async def test_budget_of_two_partitions_bounds_concurrency(
        engine_factory: Callable[..., Engine]) -> None:
    engine = engine_factory(budget_for(2, K + 2), K + 2)
    await engine.start()
    idle = engine.tracker.snapshot().memory.used_bytes
    peaks = {"synth": 0, "held": 0}

    def check(doc: StatusDocument) -> None:
        assert doc.synthesis.max_concurrent == 2
        assert doc.synthesis.active <= 2
        assert doc.memory.used_bytes <= doc.memory.total_bytes
        held = sum(1 for p in doc.pipelines for part in p.partitions
                   if part.state in ("synthesizing", "synth_done", "gpu"))
        assert held <= 2
        peaks["synth"] = max(peaks["synth"], doc.synthesis.active)
        peaks["held"] = max(peaks["held"], held)

    jobs = [engine.submit("porep-c2", 4, K + 2) for _ in range(3)]
    await wait_jobs(engine, jobs, on_poll=check)
    assert all(job.state == "done" and all(job.verified) for job in jobs)
    assert peaks["held"] == 2  # the budget was the limit, not a lack of work
    assert idle == 0
    assert engine.tracker.snapshot().memory.used_bytes == engine.budget.pinned_bytes() > 0


async def test_oversize_job_fails_while_others_complete(
        engine_factory: Callable[..., Engine]) -> None:
    engine = engine_factory(budget_for(4))
    await engine.start()
    ok = engine.submit("snap-update", 4, K)
    huge = engine.submit("snap-update", 2, K + 4)
    ok2 = engine.submit("window-post", size_log2=K)
    assert huge.state == "failed"
    assert huge.error is not None and "whole budget" in huge.error
    await wait_jobs(engine, [ok, ok2])
    assert ok.state == ok2.state == "done"
    counters = engine.tracker.snapshot().counters
    assert counters.failed_by_kind == {"snap-update": 1}
    assert counters.total_completed == 2


def test_bad_requests_are_rejected_without_side_effects() -> None:
    async def scenario() -> None:
        engine = make_engine(2**30)
        try:
            for kind, partitions, size in [("nope", None, None), ("snap-update", 0, None),
                                           ("snap-update", None, 40), ("snap-update", 5000, None)]:
                with pytest.raises(JobRequestError):
                    engine.submit(kind, partitions, size)
            assert engine.jobs == {}
            assert engine.tracker.snapshot().pipelines == []
        finally:
            await engine.close()

    asyncio.run(scenario())


async def test_drain_finishes_every_accepted_job_queued_ones_too(
        engine_factory: Callable[..., Engine]) -> None:
    engine = engine_factory(budget_for(2, K + 2))
    await engine.start()
    first = engine.submit("porep-c2", 4, K + 2)
    second = engine.submit("porep-c2", 4, K + 2)  # queued behind the first: nothing admitted
    assert second.admitted == 0
    assert await engine.drain(60.0)
    with pytest.raises(EngineDrainingError):
        engine.submit("snap-update")
    assert (first.state, second.state) == ("done", "done")
    assert all(prover.verify(p) for job in (first, second) for p in job.proofs if p)
    assert engine.budget.used_bytes() == engine.budget.pinned_bytes()
    doc = engine.tracker.snapshot()
    assert doc.cuzkd_extensions is not None and doc.cuzkd_extensions.draining
    assert doc.counters.total_completed == 2 and doc.counters.total_failed == 0


async def test_drain_timeout_fails_what_is_still_open_and_says_so(
        engine_factory: Callable[..., Engine]) -> None:
    engine = engine_factory(budget_for(1, K + 4))
    await engine.start()
    jobs = [engine.submit("porep-c2", 8, K + 4) for _ in range(3)]
    assert not await engine.drain(0.2)
    assert all(job.finished_at is not None for job in jobs)
    failed = [job for job in jobs if job.state == "failed"]
    assert failed and all(job.error == DRAIN_TIMEOUT for job in failed)
    doc = engine.tracker.snapshot()
    assert doc.counters.total_failed == len(failed)
    states = {part.state for p in doc.pipelines for part in p.partitions}
    assert states <= {"done", "failed"}, "no accepted partition left without an end"
    assert doc.cuzkd_extensions is not None and doc.cuzkd_extensions.jobs_in_flight == 0


async def test_cut_drain_ends_it_at_once(engine_factory: Callable[..., Engine]) -> None:
    engine = engine_factory(budget_for(1, K + 4))
    await engine.start()
    job = engine.submit("porep-c2", 16, K + 4)
    assert engine.begin_drain(3600.0, "test")
    assert not engine.begin_drain(1.0, "test"), "a second drain keeps the first's deadline"
    assert engine.drain_remaining_secs() is not None
    engine.cut_drain()
    assert not await asyncio.wait_for(engine.drained(), 10)
    assert job.state == "failed" and job.error == DRAIN_TIMEOUT


async def test_test_failure_rate_fails_every_third_job(
        engine_factory: Callable[..., Engine]) -> None:
    engine = engine_factory(budget_for(4))
    engine.config = dataclasses.replace(engine.config, test_failure_rate=1 / 3)
    await engine.start()
    jobs = [engine.submit("winning-post", 2, K) for _ in range(6)]
    await wait_jobs(engine, jobs)
    assert [job.state for job in jobs] == ["done", "done", "failed"] * 2
    assert all(job.error and INJECTED_FAILURE in job.error for job in jobs[2::3])



def _fail_partition(monkeypatch: pytest.MonkeyPatch, phase: str, job_kind: str,
                    index: int) -> None:
    """Make ``prover.<phase>`` raise for partition ``index`` of jobs of ``job_kind``."""
    real = getattr(prover, phase)

    def failing(*args: Any) -> Any:
        # synthesize(job_id, partition, log_n); prove_device(witness, ...); finalize(result)
        job_id, partition = args[:2] if phase == "synthesize" else (
            args[0].job_id, args[0].partition)
        if f"-{job_kind}-" in str(job_id) and partition == index:
            raise RuntimeError(f"injected {phase} failure")
        return real(*args)

    monkeypatch.setattr(prover, phase, failing)


@pytest.mark.parametrize(("phase", "reported"), [
    ("synthesize", "synthesis failed"), ("prove_device", "GPU phase failed"),
    ("finalize", "finalization failed")])
async def test_a_failing_phase_fails_the_job_and_leaves_nothing_held(
        engine_factory: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch,
        phase: str, reported: str) -> None:
    """Whatever phase raises, the job fails, the next job still completes, and the engine goes
    back to idle: budget fully returned, every worker idle, every buffer gauge at 0."""
    _fail_partition(monkeypatch, phase, "porep-c2", 1)
    engine = engine_factory(budget_for(2))  # the scheduler has to wait
    await engine.start()
    bad = engine.submit("porep-c2", 6, K)
    good = engine.submit("snap-update", 3, K)
    await wait_jobs(engine, [bad, good])
    assert bad.state == "failed" and bad.error is not None
    assert bad.error.startswith(f"partition 1: {reported}")
    assert good.state == "done" and all(good.verified)
    doc = engine.tracker.snapshot()
    assert doc.memory.used_bytes == engine.budget.pinned_bytes()
    assert all(w.state == "idle" for w in doc.gpu_workers)
    assert doc.buffers == Buffers(synth_in_flight=0, provers_in_flight=0, aux_in_flight=0,
                                  shells_in_flight=0, pending_handles=0)
    assert (doc.counters.failed_by_kind, doc.counters.completed_by_kind) == (
        {"porep-c2": 1}, {"snap-update": 1})
    states = [part.state for p in doc.pipelines if p.proof_kind == "porep-c2"
              for part in p.partitions]
    assert states[1] == "failed" and set(states) <= {"done", "failed"}


async def test_partition_granted_after_its_job_failed_is_not_started(
        engine_factory: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    """Budget for one partition: the scheduler waits for partition 1's reservation while
    partition 0 fails and frees it. The grant must be handed back, not spent proving a partition
    of a job that has already failed."""
    _fail_partition(monkeypatch, "synthesize", "porep-c2", 0)
    engine = engine_factory(budget_for(1))
    await engine.start()
    bad = engine.submit("porep-c2", 3, K)
    good = engine.submit("window-post", 1, K)
    await wait_jobs(engine, [bad, good])
    assert bad.state == "failed" and good.state == "done"
    porep = next(p for p in engine.tracker.snapshot().pipelines if p.proof_kind == "porep-c2")
    assert [(part.state, part.synth_ms) for part in porep.partitions[1:]] == [
        ("failed", None), ("failed", None)]
    assert engine.budget.used_bytes() == engine.budget.pinned_bytes()


def test_peak_resident_memory_stays_within_the_budget_plus_a_fixed_overhead() -> None:
    """Partitions of 2^19 elements (300+ MiB of working set each) under a budget with room for
    exactly one and its NTT tables: the process's peak RSS grows by at most the budget plus
    :data:`RSS_OVERHEAD` -- what the budget does not hold (thread stacks, allocator slack) --
    and once idle it keeps no more than the pinned tables plus that overhead."""
    log_n = 19
    budget = budget_for(1, log_n)
    out = subprocess.run([sys.executable, str(RSS_CHILD), str(budget), str(log_n), "2"],
                         capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["state"] == "done", report["error"]
    assert report["used_after"] == report["pinned"] == budget - sum(
        prover.partition_bytes(log_n))
    growth = report["peak"] - report["baseline"]
    assert growth <= budget + RSS_OVERHEAD, (growth / 2**20, budget / 2**20)
    # Idle again, it keeps what the budget still holds (the pinned tables), not the peak.
    kept = report["idle"] - report["baseline"]
    assert kept <= report["pinned"] + RSS_OVERHEAD, (kept / 2**20, report["pinned"] / 2**20)


async def test_a_partition_that_fits_only_without_its_tables_fails_at_submission(
        engine_factory: Callable[..., Engine]) -> None:
    """The NTT tables a size needs are pinned in the budget: a budget with room for the
    partition but not for them would otherwise admit work it cannot hold."""
    engine = engine_factory(sum(prover.partition_bytes(K)))
    await engine.start()
    job = engine.submit("window-post", 1, K)
    assert job.state == "failed" and job.error is not None
    assert f"size_log2 {K}: partition needs" in job.error
    assert engine.budget.used_bytes() == 0
    # With room for both, the tables are pinned once and stay for later jobs of the size.
    engine = engine_factory(budget_for(1))
    await engine.start()
    jobs = [engine.submit("window-post", 1, K) for _ in range(2)]
    await wait_jobs(engine, jobs)
    assert all(j.state == "done" for j in jobs)
    assert engine.budget.pinned_bytes() == prover.table_bytes(K) + prover.table_bytes(K + 1)
