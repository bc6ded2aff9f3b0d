"""Busy time derived from 1 s polls matches the engine's own, replayed on virtual time.

The documents are recorded from :class:`~cuzkd.status.tracker.StatusTracker` (the reference
engine's status model: its ``cuzkd_extensions`` carry each worker's exact busy time, by the
engine's own rule -- busy from picking a partition up until that partition ends or the worker
picks up the next one) driven through ten virtual minutes of GPU runs of 0.5-8 s by 4 workers.
Each poll's document, stripped of its extensions as a real cuzk serves it, goes through the
supervisor's :class:`~cuzkd.status.derive.ExtensionDeriver`; the derived totals must stay
within 2 % of the window of the true ones, worker by worker. Spans that begin and end between
two polls are in the true total and invisible to the deriver: they are part of the 2 %.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import pytest

from cuzkd.status.derive import ExtensionDeriver
from cuzkd.status.tracker import StatusTracker

WORKERS = 4
WINDOW_SECS = 600.0
PARTITIONS = 10


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Run:
    """One GPU run: the worker picks the partition up at ``start``; its device part ends at
    ``device_end`` and the partition at ``end`` (later when a finalizer finishes it)."""

    worker: int
    start: float
    device_end: float
    end: float


def runs(rng: random.Random, gap_max: float, finalize_max: float) -> list[Run]:
    """Each worker's GPU runs: 0.5-8 s each, the next one picked up 0-``gap_max`` s after the
    device part (split proving: before its finalizer ends the last when ``finalize_max``)."""
    found: list[Run] = []
    for worker in range(WORKERS):
        at = rng.uniform(0, 2)
        while at < WINDOW_SECS:
            device_end = at + rng.uniform(0.5, 8.0)
            found.append(Run(worker, at, device_end, device_end + rng.uniform(0, finalize_max)))
            at = device_end + rng.uniform(0, gap_max)
    return sorted(found, key=lambda run: run.start)


def events(tracker: StatusTracker, plan: list[Run]) -> list[tuple[float, Callable[[], None]]]:
    """The tracker calls the plan makes, by time: partitions handed out in pick-up order."""
    timeline: list[tuple[float, Callable[[], None]]] = []
    for number, run in enumerate(plan):
        job, index = f"porep-1000-{number // PARTITIONS}", number % PARTITIONS

        def start(job: str = job, index: int = index, worker: int = run.worker) -> None:
            if index == 0:
                tracker.register_job(job, "porep-c2", PARTITIONS)
            tracker.partition_synth_start(job, index)
            tracker.partition_synth_end(job, index)
            tracker.partition_gpu_start(job, index, worker)

        def end(job: str = job, index: int = index, worker: int = run.worker) -> None:
            tracker.partition_gpu_end(job, index, worker)
            if index == PARTITIONS - 1:
                tracker.job_completed(job, "porep-c2", success=True)

        timeline += [(run.start, start), (run.end, end)]
    return sorted(timeline, key=lambda event: event[0])


def replay(seed: int, gap_max: float, finalize_max: float) -> tuple[dict[int, float],
                                                                     dict[int, float]]:
    """(true, derived) busy seconds per worker after ten minutes of 1 s polls."""
    rng = random.Random(seed)
    clock = Clock()
    tracker = StatusTracker(clock=clock)
    tracker.register_workers((worker, worker // 2) for worker in range(WORKERS))
    deriver = ExtensionDeriver(clock=clock)
    pending = events(tracker, runs(rng, gap_max, finalize_max))
    derived_before = dict.fromkeys(range(WORKERS), 0.0)
    poll_at, truth = 0.0, {}
    while poll_at <= WINDOW_SECS:
        while pending and pending[0][0] <= poll_at:
            clock.now, call = pending.pop(0)
            call()
        clock.now = poll_at
        document = tracker.snapshot()
        assert document.cuzkd_extensions is not None
        truth = {w.worker_id: w.busy_seconds_total
                 for w in document.cuzkd_extensions.worker_busy}
        deriver.observe(msgspec.structs.replace(document, cuzkd_extensions=None))
        derived = {w.worker_id: w.busy_seconds_total for w in deriver.extensions().worker_busy}
        assert all(derived[w] >= derived_before[w] for w in derived)  # a counter
        derived_before = derived
        poll_at += 1.0 + rng.uniform(-0.05, 0.05)  # a supervisor's polls are not exact
    return truth, derived_before


@pytest.mark.parametrize(("gap_max", "finalize_max"), [
    pytest.param(0.0, 0.0, id="full-load"),
    pytest.param(0.0, 1.0, id="full-load-split-proving"),
    pytest.param(2.0, 0.0, id="gaps-0-2s"),
])
def test_busy_seconds_from_polls_within_two_percent_of_the_window(
    gap_max: float, finalize_max: float
) -> None:
    truth, derived = replay(seed=24, gap_max=gap_max, finalize_max=finalize_max)
    assert set(derived) == set(range(WORKERS))
    errors = {w: abs(derived[w] - truth[w]) / WINDOW_SECS for w in truth}
    assert max(errors.values()) <= 0.02, (truth, derived)
