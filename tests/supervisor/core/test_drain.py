"""The cuzk drain's decisions with plain values: which jobs are in flight, when a cuzk holds
nothing, what a stop now throws away, and how much of a bounded stop the drain may take."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cuzkd.cuzk.reading import KindQueue, QueueReading
from cuzkd.kinds import reported_kind
from cuzkd.states import DrainResult, StopReason
from cuzkd.status.document import StatusDocument, decode_status
from cuzkd.supervisor.core.drain import (
    LostJobs,
    LostWork,
    cuzk_idle,
    jobs_in_flight,
    lost_jobs,
    lost_work,
)
from cuzkd.supervisor.core.stopsequence import (
    DrainOver,
    ReadStatus,
    SendSignal,
    StopSequence,
    drain_budget,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "cuzk-status.example.json"


def job(job_id: str, kind: str, *states: str) -> dict[str, Any]:
    return {"job_id": job_id, "proof_kind": kind, "started_secs_ago": 1.0,
            "total_partitions": len(states),
            "partitions_done": sum(s == "done" for s in states),
            "partitions": [{"index": i, "state": s, "synth_ms": None, "gpu_ms": None}
                           for i, s in enumerate(states)]}


def doc(*pipelines: dict[str, Any]) -> StatusDocument:
    raw = json.loads(EXAMPLE.read_text())
    raw["pipelines"] = list(pipelines)
    return decode_status(json.dumps(raw))


def queues(**jobs: tuple[int, int]) -> QueueReading:
    return QueueReading({kind.replace("_", "-"): KindQueue(*n) for kind, n in jobs.items()})


EMPTY = queues(porep_c2=(0, 0), snap_update=(0, 0), window_post=(0, 0), winning_post=(0, 0))


def test_a_job_is_in_flight_until_done_and_never_once_a_partition_failed() -> None:
    shown = doc(job("porep-1-1", "porep-c2", "done", "gpu", "pending"),
                job("snap-1-2", "snap-update", "done", "failed", "gpu"),  # left behind
                job("porep-1-3", "porep-c2", "done", "done"),  # completed, kept 30 s
                job("snap-1-4", "snap-update", "pending", "pending"))  # dispatched, waiting
    assert jobs_in_flight(shown) == {"porep-c2": ["porep-1-1"], "snap-update": ["snap-1-4"]}
    assert jobs_in_flight(None) == {}


def test_idle_needs_both_sources_and_a_known_getstatus() -> None:
    assert cuzk_idle(doc(job("p", "porep-c2", "done", "failed")), EMPTY)
    assert not cuzk_idle(doc(job("p", "porep-c2", "done", "synth_done")), EMPTY)
    # WindowPoSt is proved whole: only GetStatus sees it
    assert not cuzk_idle(doc(), queues(window_post=(0, 1)))
    assert not cuzk_idle(doc(), queues(porep_c2=(3, 0)))  # queued, not yet in /status
    assert not cuzk_idle(doc(), QueueReading.unknown("GetStatus: UNAVAILABLE"))


def test_lost_jobs_counts_each_job_once_per_kind_and_names_them() -> None:
    shown = doc(job("porep-1-1", "porep-c2", "gpu"), job("porep-1-2", "porep-c2", "pending"))
    reading = QueueReading({"porep-c2": KindQueue(1, 2), "winning-post": KindQueue(0, 1)},
                           current_jobs=("porep-1-1", "winning-1-[7]"))
    assert lost_jobs(shown, reading) == LostJobs({"porep-c2": 3, "winning-post": 1},
                                                 ("porep-1-1", "porep-1-2", "winning-1-[7]"))
    # without a GetStatus (a stall kill, an engine of another type): /status alone
    assert lost_jobs(shown, None) == LostJobs({"porep-c2": 2}, ("porep-1-1", "porep-1-2"))
    assert lost_jobs(shown, QueueReading.unknown("x")).by_kind == {"porep-c2": 2}
    assert lost_jobs(None, EMPTY) == LostJobs({}, ())


@pytest.mark.parametrize("reason", [StopReason.OPERATOR, StopReason.RELOAD, StopReason.SWAP,
                                    StopReason.STALL, StopReason.SHUTDOWN])
def test_a_stop_counts_the_work_in_flight_it_throws_away(reason: StopReason) -> None:
    shown = doc(job("porep-1-1", "porep-c2", "synthesizing", "gpu", "done", "pending"))
    assert lost_work(reason, shown, None, status_polled=True, drained_clean=False) == LostWork(
        2, LostJobs({"porep-c2": 1}, ("porep-1-1",)))


@pytest.mark.parametrize("reason", [StopReason.UNHEALTHY, StopReason.START_TIMEOUT])
def test_a_health_kill_counts_no_lost_work(reason: StopReason) -> None:
    shown = doc(job("porep-1-1", "porep-c2", "gpu"))
    assert lost_work(reason, shown, None, status_polled=True, drained_clean=False) is None


def test_no_lost_work_without_a_status_or_after_a_clean_door_drain() -> None:
    shown = doc(job("porep-1-1", "porep-c2", "gpu"))
    assert lost_work(StopReason.OPERATOR, None, None, status_polled=False,
                     drained_clean=False) is None
    assert lost_work(StopReason.OPERATOR, shown, None, status_polled=True,
                     drained_clean=True) is None
    # a status that never answered: counted, as nothing
    assert lost_work(StopReason.OPERATOR, None, None, status_polled=True,
                     drained_clean=False) == LostWork(0, LostJobs({}, ()))


@pytest.mark.parametrize(("name", "label"), [
    ("porep_c2", "porep-c2"), ("porep-c2", "porep-c2"), ("SNAP_UPDATE", "snap-update"),
    ("window_post", "window-post"), ("winning-post", "winning-post"),
    ("ps-snap", "other"), ("", "other"), ("x" * 10_000, "other"),
])
def test_kind_spellings_become_one_bounded_label(name: str, label: str) -> None:
    assert reported_kind(name) == label


def test_a_bounded_stop_drains_for_what_the_bound_leaves_after_stop_timeout() -> None:
    assert drain_budget(180, 10, None) == 180
    assert drain_budget(180, 10, 30) == 20
    assert drain_budget(5, 10, 30) == 5
    assert drain_budget(180, 10, 4) == 0
    seq = StopSequence.begin(100.0, drain_mode="cuzk", drain_timeout=180, stop_timeout=10,
                             health_interval=1.0, within=30)
    assert seq.deadline == 120.0
    assert seq.step(100.0, exited=False) == ReadStatus(by=120.0)
    seq.status_read(False)
    assert seq.step(120.0, exited=False) == DrainOver(DrainResult.TIMEOUT, 20.0)
    assert seq.step(120.0, exited=False) == SendSignal(kill=False, ends_work=True)


def test_a_cuzk_drain_ends_on_the_second_idle_reading_in_a_row() -> None:
    """A finished job's Prove reply gets a read's time to leave before the stop signal."""
    seq = StopSequence.begin(0.0, drain_mode="cuzk", drain_timeout=180, stop_timeout=10,
                             health_interval=0.25)
    for now, idle in ((0.0, True), (0.25, False), (0.5, True)):
        assert seq.step(now, exited=False) == ReadStatus(by=180.0)
        seq.status_read(idle)
    assert seq.step(0.75, exited=False) == ReadStatus(by=180.0)
    seq.status_read(True)
    over = seq.step(0.75, exited=False)
    assert isinstance(over, DrainOver) and over.result is DrainResult.CLEAN
    assert seq.step(0.75, exited=False) == SendSignal(kill=False, ends_work=True)
