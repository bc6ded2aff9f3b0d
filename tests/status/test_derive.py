"""ExtensionDeriver over documents in exactly cuzk's format (built from cuzk's example)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cuzkd.status.derive import (
    RESTART_SLACK_SECS,
    SRS_HOLD_SECS,
    ExtensionDeriver,
    entered_phases,
)
from cuzkd.status.document import Extensions, Partition, StatusDocument, decode_status

PHASES = ("synthesizing", "synth_done", "gpu", "done", "failed")
POREP = "ps-porep-1201-77-4411"


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def example(reference_dir: Path) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((reference_dir / "cuzk-status.example.json").read_bytes())
    return raw


@pytest.fixture
def clock() -> Clock:
    return Clock()


def poll(clock: Clock, base: dict[str, Any], uptime_delta: float = 1.0) -> dict[str, Any]:
    """The next document: a copy of ``base`` one poll later (engine and our clock advance; a
    worker still proving has been busy that much longer, and every job is that much older)."""
    doc = copy.deepcopy(base)
    doc["uptime_secs"] = base["uptime_secs"] + uptime_delta
    for worker in doc["gpu_workers"]:
        if worker["busy_secs"] is not None:
            worker["busy_secs"] += uptime_delta
    for pipeline in doc["pipelines"]:
        pipeline["started_secs_ago"] += uptime_delta
    clock.now += uptime_delta
    return doc


def decode(raw: dict[str, Any]) -> StatusDocument:
    return decode_status(json.dumps(raw))


def counts(ext: Extensions, kind: str) -> tuple[int, ...]:
    return tuple(ext.phase_transitions[kind][p] for p in PHASES)


def set_partition(raw: dict[str, Any], job: str, index: int, state: str,
                  synth_ms: int | None, gpu_ms: int | None) -> None:
    pipeline = next(p for p in raw["pipelines"] if p["job_id"] == job)
    pipeline["partitions"][index] = {
        "index": index, "state": state, "synth_ms": synth_ms, "gpu_ms": gpu_ms}


def set_worker(raw: dict[str, Any], worker_id: int, job: str | None, partition: int | None,
               busy_secs: float | None) -> None:
    raw["gpu_workers"][worker_id].update(
        state="idle" if job is None else "proving", current_job=job,
        current_partition=partition, busy_secs=busy_secs)


def busy(ext: Extensions) -> dict[int, float]:
    return {w.worker_id: w.busy_seconds_total for w in ext.worker_busy}


def test_first_observation_counts_every_phase_each_partition_passed(
    example: dict[str, Any], clock: Clock
) -> None:
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))
    ext = deriver.extensions()
    # porep-c2: 4 done, 1 gpu, 1 synth_done, 3 synthesizing, 1 pending
    assert counts(ext, "porep-c2") == (9, 6, 5, 4, 0)
    assert counts(ext, "snap-update") == (16, 16, 16, 16, 0)
    synth, gpu = ext.synth_duration_seconds["porep-c2"], ext.gpu_duration_seconds["porep-c2"]
    assert (synth.count, synth.sum) == (6, pytest.approx((30110 + 30111 + 30112 + 30113
                                                          + 30422 + 30390) / 1000))
    assert (gpu.count, gpu.sum) == (4, pytest.approx((2150 + 2151 + 2152 + 2153) / 1000))
    assert ext.gpu_duration_seconds["snap-update"].sum == pytest.approx(sum(range(402, 418)) / 1000)
    assert busy(ext) == {0: pytest.approx(1.21), 1: 0.0}
    assert ext.jobs_in_flight == 1
    assert (ext.backend, ext.gpu_devices) == ("cuzk", [])

    deriver.observe(decode(example))  # the same document again
    deriver.observe(decode(poll(clock, example)))  # a later one, nothing moved
    later = deriver.extensions()
    assert busy(later) == {0: pytest.approx(2.21), 1: 0.0}  # still on its partition
    assert msgspec.structs.replace(later, worker_busy=ext.worker_busy) == ext


def test_partitions_skipping_phases_between_polls_count_each_entry_once(
    example: dict[str, Any], clock: Clock
) -> None:
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))
    later = poll(clock, example)
    set_partition(later, POREP, 9, "done", 30000, 2000)  # pending -> done
    set_partition(later, POREP, 6, "failed", 9000, None)  # failed while synthesizing
    set_partition(later, POREP, 7, "failed", 30000, 500)  # failed on the GPU
    set_partition(later, POREP, 5, "gpu", 30390, 100)  # synth_done -> gpu
    deriver.observe(decode(later))
    ext = deriver.extensions()
    # synthesizing +1 (p9); synth_done +2 (p9, p7); gpu +3 (p9, p7, p5); done +1; failed +2
    assert counts(ext, "porep-c2") == (10, 8, 8, 5, 2)
    assert ext.synth_duration_seconds["porep-c2"].count == 8  # + p9 and p7 (reached gpu)
    assert ext.gpu_duration_seconds["porep-c2"].count == 5  # + p9

    again = poll(clock, later)
    set_partition(again, POREP, 5, "done", 30390, 2000)
    deriver.observe(decode(again))
    deriver.observe(decode(poll(clock, again)))
    ext = deriver.extensions()
    assert counts(ext, "porep-c2") == (10, 8, 8, 6, 2)
    assert ext.gpu_duration_seconds["porep-c2"].count == 6


def test_worker_switching_partitions_between_polls_places_each_span_end(
    example: dict[str, Any], clock: Clock
) -> None:
    """A span is placed by busy_secs and ends unseen: at its partition's start + gpu_ms when
    that is listed done, never after the next span began; else when the next span began or,
    gone idle, half-way between the polls."""
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))  # w0 on (porep-c2, 4) for 1.21 s: began at 4998.79
    doc = poll(clock, example)
    deriver.observe(decode(doc))
    assert busy(deriver.extensions())[0] == pytest.approx(2.21)
    doc = poll(clock, doc)  # 5002
    set_partition(doc, POREP, 4, "done", 30113, 2400)  # ended at 5001.19
    set_partition(doc, POREP, 5, "gpu", 30390, 500)
    set_worker(doc, 0, POREP, 5, 0.5)  # began at 5001.5
    deriver.observe(decode(doc))
    assert busy(deriver.extensions()) == {0: pytest.approx(2.4 + 0.5), 1: 0.0}
    doc = poll(clock, doc)  # 5003: (porep-c2, 5) is not listed done: ended half-way
    set_worker(doc, 0, None, None, None)
    deriver.observe(decode(doc))
    assert busy(deriver.extensions())[0] == pytest.approx(2.4 + 1.0)
    doc = poll(clock, doc)  # 5004
    set_worker(doc, 0, POREP, 5, 0.1)  # the same partition again: a new span
    deriver.observe(decode(doc))
    assert busy(deriver.extensions())[0] == pytest.approx(2.4 + 1.0 + 0.1)
    doc = poll(clock, doc)  # 5005
    set_worker(doc, 0, POREP, 5, 0.3)  # restarted at 5004.7: the second span ended then
    deriver.observe(decode(doc))
    assert busy(deriver.extensions())[0] == pytest.approx(2.4 + 1.0 + 0.8 + 0.3)


def test_busy_secs_out_of_line_counts_no_second_twice(
    example: dict[str, Any], clock: Clock
) -> None:
    """A span claiming to have begun before the worker was last seen idle, or before the span
    it replaces ended, counts only time since then: no second is counted twice."""
    deriver = ExtensionDeriver(clock=clock)
    doc = copy.deepcopy(example)
    set_worker(doc, 0, None, None, None)
    deriver.observe(decode(doc))  # 5000: idle
    doc = poll(clock, doc)
    set_worker(doc, 0, POREP, 4, 50.0)  # "began" at 4951
    deriver.observe(decode(doc))
    assert busy(deriver.extensions())[0] == pytest.approx(1.0)
    doc = poll(clock, doc)
    set_partition(doc, POREP, 5, "gpu", 30390, 99000)
    set_worker(doc, 0, POREP, 5, 99.0)  # 5002: the first span ended half-way, at 5001.5
    deriver.observe(decode(doc))
    assert busy(deriver.extensions())[0] == pytest.approx(1.5 + 0.5)


def test_vanished_jobs_are_forgotten_and_counters_kept(
    example: dict[str, Any], clock: Clock
) -> None:
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))
    before = counts(deriver.extensions(), "snap-update")
    doc = poll(clock, example)
    doc["pipelines"] = [p for p in doc["pipelines"] if p["proof_kind"] != "snap-update"]
    deriver.observe(decode(doc))
    assert counts(deriver.extensions(), "snap-update") == before
    back = poll(clock, doc)
    back["pipelines"] = example["pipelines"]
    deriver.observe(decode(back))  # forgotten: seen as a new job
    assert counts(deriver.extensions(), "snap-update") == (32, 32, 32, 32, 0)


def test_engine_restart_resets_counters(example: dict[str, Any], clock: Clock) -> None:
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))
    fresh = poll(clock, example)
    fresh["uptime_secs"] = 3.0  # uptime went down
    fresh["pipelines"] = [p for p in fresh["pipelines"] if p["proof_kind"] == "snap-update"]
    set_worker(fresh, 0, None, None, None)
    deriver.observe(decode(fresh))
    ext = deriver.extensions()
    assert counts(ext, "snap-update") == (16, 16, 16, 16, 0)
    assert "porep-c2" not in ext.phase_transitions
    assert busy(ext) == {0: 0.0, 1: 0.0}


def test_restart_missed_by_uptime_is_caught_by_start_time_jump(
    example: dict[str, Any], clock: Clock
) -> None:
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))  # uptime 812.44
    jittery = poll(clock, example, uptime_delta=1.0)
    clock.now += RESTART_SLACK_SECS / 2  # a slow fetch is not a restart
    deriver.observe(decode(jittery))
    assert counts(deriver.extensions(), "porep-c2") == (9, 6, 5, 4, 0)
    # the engine died; its successor came up and had run 900 s by our next look, 1000 s later
    clock.now += 1000.0
    successor = copy.deepcopy(example)
    successor["uptime_secs"] = 900.0
    successor["pipelines"] = []
    deriver.observe(decode(successor))
    assert deriver.extensions().phase_transitions == {}


@pytest.mark.parametrize(("before", "after", "expected"), [
    (None, ("pending", None, None), []),
    (None, ("gpu", 1, 1), ["synthesizing", "synth_done", "gpu"]),
    (("pending", None, None), ("gpu", 1, 1), ["synthesizing", "synth_done", "gpu"]),
    (("synth_done", 1, None), ("done", 1, 1), ["gpu", "done"]),
    (("gpu", 1, 1), ("gpu", 1, 2), []),
    (("gpu", 1, 1), ("synthesizing", 1, None), []),
    (None, ("failed", None, None), ["failed"]),
    (None, ("failed", 1, None), ["synthesizing", "failed"]),
    (None, ("failed", 1, 1), ["synthesizing", "synth_done", "gpu", "failed"]),
    (("synthesizing", 1, None), ("failed", 1, None), ["failed"]),
    (("failed", 1, None), ("failed", 1, None), []),
    (("done", 1, 1), ("failed", 1, 1), []),
])
def test_entered_phases(before: tuple[Any, ...] | None, after: tuple[Any, ...],
                        expected: list[str]) -> None:
    def part(spec: tuple[Any, ...]) -> Partition:
        return Partition(index=0, state=spec[0], synth_ms=spec[1], gpu_ms=spec[2])

    assert entered_phases(None if before is None else part(before), part(after)) == expected


def test_failure_after_synthesis_is_counted_once_however_long_it_stays_listed(
    example: dict[str, Any], clock: Clock
) -> None:
    """A partition seen ``synth_done`` that then fails before the GPU (``gpu_ms`` null) proves
    a lower rank than its last state; it must still be remembered as failed, or each later poll
    that lists it counts ``failed`` again."""
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))  # porep-c2 partition 5 is synth_done
    before = counts(deriver.extensions(), "porep-c2")
    doc = poll(clock, example)
    set_partition(doc, POREP, 5, "failed", 30390, None)
    for _ in range(3):
        deriver.observe(decode(doc))
        doc = poll(clock, doc)
    assert counts(deriver.extensions(), "porep-c2") == (*before[:4], before[4] + 1)


def test_duplicate_jobs_and_workers_in_a_document_count_once(
    example: dict[str, Any], clock: Clock
) -> None:
    """An odd document listing a job or a worker twice must not inflate counters: a new job
    counted per entry, or a worker whose two entries alternate spans (each poll would close a
    span and add it to the total)."""
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))
    clean = deriver.extensions()

    odd = ExtensionDeriver(clock=clock)
    doc = copy.deepcopy(example)
    doc["pipelines"].append(copy.deepcopy(doc["pipelines"][1]))
    doc["gpu_workers"].append({**doc["gpu_workers"][1], "state": "proving",
                               "current_job": POREP, "current_partition": 5, "busy_secs": 0.7})
    for _ in range(3):
        odd.observe(decode(doc))
        doc = poll(clock, doc)
    ext = odd.extensions()
    assert ext.phase_transitions == clean.phase_transitions
    assert ext.jobs_in_flight == clean.jobs_in_flight
    assert busy(ext) == {0: pytest.approx(1.21 + 2), 1: 0.0}


def finish_all(raw: dict[str, Any], job: str) -> None:
    pipeline = next(p for p in raw["pipelines"] if p["job_id"] == job)
    for part in pipeline["partitions"]:
        part.update(state="done", synth_ms=part["synth_ms"] or 1, gpu_ms=part["gpu_ms"] or 1)
    pipeline["partitions_done"] = pipeline["total_partitions"]


def test_job_duration_runs_from_started_secs_ago_to_the_poll_showing_it_finished(
        example: dict[str, Any], clock: Clock) -> None:
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))  # porep-c2 in flight, started 41.2 s ago; snap-update done
    raw = poll(clock, example, 10.0)
    deriver.observe(decode(raw))
    raw = poll(clock, raw, 5.0)
    finish_all(raw, "ps-porep-1201-77-4411")
    deriver.observe(decode(raw))
    deriver.observe(decode(poll(clock, raw, 1.0)))  # still listed, finished: not timed again
    jobs = deriver.extensions().job_duration_seconds
    assert (jobs["porep-c2"].count, jobs["porep-c2"].sum) == (1, pytest.approx(41.2 + 15.0))
    assert jobs["snap-update"].count == 0  # first seen already finished: its end is unknown


def test_a_job_gone_unfinished_ends_when_it_leaves_the_list(example: dict[str, Any],
                                                            clock: Clock) -> None:
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))
    raw = poll(clock, example, 20.0)
    raw["pipelines"] = [p for p in raw["pipelines"] if p["job_id"] != "ps-porep-1201-77-4411"]
    deriver.observe(decode(raw))
    deriver.observe(decode(poll(clock, raw, 1.0)))
    jobs = deriver.extensions().job_duration_seconds
    assert (jobs["porep-c2"].count, jobs["porep-c2"].sum) == (1, pytest.approx(41.2 + 20.0))


def test_unchanged_jobs_between_polls_count_nothing_and_a_later_change_counts_once(
    example: dict[str, Any], clock: Clock
) -> None:
    """Most jobs of a busy engine are listed identically poll after poll (the deriver skips
    them); a partition moving after many such polls is still counted exactly once."""
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))
    first = deriver.extensions()
    doc = example
    for _ in range(3):
        doc = poll(clock, doc)
        deriver.observe(decode(doc))
    assert msgspec.structs.replace(deriver.extensions(), worker_busy=first.worker_busy) == first
    pending = next(i for i, p in enumerate(
        next(p for p in doc["pipelines"] if p["job_id"] == POREP)["partitions"])
        if p["state"] == "pending")
    set_partition(doc, POREP, pending, "synth_done", 40, None)
    for _ in range(3):
        doc = poll(clock, doc)
        deriver.observe(decode(doc))
    synthesizing, synth_done, *_ = counts(deriver.extensions(), "porep-c2")
    assert (synthesizing, synth_done) == (counts(first, "porep-c2")[0] + 1,
                                          counts(first, "porep-c2")[1] + 1)
    assert deriver.extensions().synth_duration_seconds["porep-c2"].count == \
        first.synth_duration_seconds["porep-c2"].count + 1


def test_jobs_in_flight_follows_a_job_listed_unchanged_then_finished_or_resized(
        example: dict[str, Any], clock: Clock) -> None:
    """A job listed as before reuses its count of finished partitions; a listing that changed,
    or the same listing with another ``total_partitions``, is counted anew."""
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))
    running = deriver.extensions().jobs_in_flight
    assert running >= 1
    raw = poll(clock, example)
    deriver.observe(decode(raw))
    assert deriver.extensions().jobs_in_flight == running
    raw = poll(clock, raw)
    finish_all(raw, POREP)
    deriver.observe(decode(raw))
    assert deriver.extensions().jobs_in_flight == running - 1
    raw = poll(clock, raw)
    next(p for p in raw["pipelines"] if p["job_id"] == POREP)["total_partitions"] += 1
    deriver.observe(decode(raw))  # same partitions, one more to come: in flight again
    assert deriver.extensions().jobs_in_flight == running


def test_a_document_whose_uptime_did_not_decode_is_folded_in_without_the_restart_check(
        example: dict[str, Any], clock: Clock) -> None:
    """``uptime_secs`` unknown (None): the partitions still count, nothing is reset, and the
    next document with an uptime is checked against the last known one (here: lower, an
    engine restart, which resets the counters)."""
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))
    unknown = poll(clock, example)
    unknown["uptime_secs"] = None
    set_partition(unknown, POREP, 9, "synthesizing", 10, None)  # was pending
    deriver.observe(decode(unknown))
    assert counts(deriver.extensions(), "porep-c2") == (10, 6, 5, 4, 0)
    restarted = {**poll(clock, example), "uptime_secs": 5.0, "pipelines": []}
    deriver.observe(decode(restarted))
    assert "porep-c2" not in deriver.extensions().phase_transitions


def test_a_job_with_a_failed_partition_is_stale_not_in_flight_and_counts_its_failure_once(
    example: dict[str, Any], clock: Clock
) -> None:
    """cuzk leaves a failed job listed for good: it is a leftover, not work in flight."""
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))
    assert deriver.extensions().jobs_in_flight == 1
    doc = poll(clock, example)
    set_partition(doc, POREP, 6, "failed", 9000, None)
    for _ in range(5):
        deriver.observe(decode(doc))
        doc = poll(clock, doc)
    ext = deriver.extensions()
    assert ext.jobs_in_flight == 0
    assert counts(ext, "porep-c2")[4] == 1
    [stale] = ext.stale_jobs
    assert (stale.job_id, stale.proof_kind, stale.failed_partitions) == (POREP, "porep-c2", 1)
    assert stale.age_secs == pytest.approx(next(
        p for p in example["pipelines"] if p["job_id"] == POREP)["started_secs_ago"] + 5)


def test_a_job_without_progress_for_stale_after_is_stale_ticking_ms_are_no_progress(
    example: dict[str, Any], clock: Clock
) -> None:
    deriver = ExtensionDeriver(clock=clock, stale_after=60.0)
    deriver.observe(decode(example))
    doc = example
    for _ in range(59):
        doc = poll(clock, doc)
        for part in next(p for p in doc["pipelines"] if p["job_id"] == POREP)["partitions"]:
            if part["state"] == "synthesizing":
                part["synth_ms"] += 1000  # a running phase's clock ticks: not progress
        deriver.observe(decode(doc))
    assert deriver.extensions().stale_jobs == []
    doc = poll(clock, doc)
    deriver.observe(decode(doc))
    ext = deriver.extensions()
    assert [(s.job_id, s.idle_secs, s.failed_partitions) for s in ext.stale_jobs] == [
        (POREP, pytest.approx(60.0), 0)]
    assert ext.jobs_in_flight == 0
    doc = poll(clock, doc)
    set_partition(doc, POREP, 9, "synthesizing", 0, None)  # it moves again
    deriver.observe(decode(doc))
    assert (deriver.extensions().stale_jobs, deriver.extensions().jobs_in_flight) == ([], 1)


def test_a_job_id_seen_again_with_a_smaller_started_secs_ago_is_a_new_job(
    example: dict[str, Any], clock: Clock
) -> None:
    """Curio's retries reuse ids: the retry's partitions count as new ones."""
    deriver = ExtensionDeriver(clock=clock)
    failed = copy.deepcopy(example)
    set_partition(failed, POREP, 6, "failed", 9000, None)
    deriver.observe(decode(failed))
    assert (counts(deriver.extensions(), "porep-c2")[4], len(deriver.extensions().stale_jobs)) \
        == (1, 1)
    retry = poll(clock, failed)
    pipeline = next(p for p in retry["pipelines"] if p["job_id"] == POREP)
    pipeline["started_secs_ago"] = 0.5
    for index in range(10):
        set_partition(retry, POREP, index, "pending", None, None)
    set_partition(retry, POREP, 0, "synthesizing", 100, None)
    set_worker(retry, 0, None, None, None)
    deriver.observe(decode(retry))
    ext = deriver.extensions()
    assert counts(ext, "porep-c2") == (9 + 1, 6, 5, 4, 1)
    assert (ext.stale_jobs, ext.jobs_in_flight) == ([], 1)


def test_a_worker_left_proving_a_done_partition_two_polls_in_a_row_is_not_busy(
    example: dict[str, Any], clock: Clock
) -> None:
    """A failed GPU run leaves its partition done and its worker proving it: busy until the
    partition's own end, then not busy, counted once under its reason."""
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))  # 5000: w0 on (porep-c2, 4) since 4998.79
    doc = poll(clock, example)
    set_partition(doc, POREP, 4, "done", 30113, 1500)  # ended at 5000.29; w0 still shown on it
    deriver.observe(decode(doc))
    ext = deriver.extensions()
    assert (busy(ext)[0], ext.phantom_busy_workers) == (pytest.approx(1.21), [])
    for _ in range(3):
        doc = poll(clock, doc)
        deriver.observe(decode(doc))
    ext = deriver.extensions()
    assert (busy(ext)[0], ext.phantom_busy_workers) == (pytest.approx(1.5), [0])
    assert ext.phantom_busy_total == {"job_not_listed": 0, "job_stale": 0,
                                      "partition_not_gpu": 1}
    doc = poll(clock, doc)
    set_partition(doc, POREP, 5, "gpu", 30390, 200)
    set_worker(doc, 0, POREP, 5, 0.2)  # it picked up the next one: busy again
    deriver.observe(decode(doc))
    ext = deriver.extensions()
    assert (busy(ext)[0], ext.phantom_busy_workers) == (pytest.approx(1.7), [])


def test_a_worker_on_a_partition_of_a_stale_job_is_not_busy(
    example: dict[str, Any], clock: Clock
) -> None:
    deriver = ExtensionDeriver(clock=clock)
    doc = copy.deepcopy(example)
    set_partition(doc, POREP, 6, "failed", 9000, None)  # w0's partition 4 stays `gpu`
    for _ in range(2):
        deriver.observe(decode(doc))
        doc = poll(clock, doc)
    ext = deriver.extensions()
    assert (ext.phantom_busy_workers, busy(ext)[0]) == ([0], 0.0)  # never seen busy genuinely
    assert ext.phantom_busy_total["job_stale"] == 1


def test_an_empty_srs_list_keeps_the_last_known_one_for_a_bounded_time(
    example: dict[str, Any], clock: Clock
) -> None:
    """cuzk serves srs [] while its SRS manager is busy (a 30-90 s load): the last list is
    held for SRS_HOLD_SECS, then the empty one is believed."""
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(example))
    known = decode(example).allocations.srs
    assert known and deriver.extensions().held_srs == []
    doc = poll(clock, example)
    doc["allocations"]["srs"] = []
    deriver.observe(decode(doc))
    assert deriver.extensions().held_srs == known
    doc = poll(clock, doc, uptime_delta=SRS_HOLD_SECS)  # now past the hold
    deriver.observe(decode(doc))
    assert deriver.extensions().held_srs == []


def test_a_span_never_began_before_the_engine_started(
    example: dict[str, Any], clock: Clock
) -> None:
    """A busy_secs far beyond the engine's uptime is the document's error: the span counts
    from the engine's start at most."""
    doc = copy.deepcopy(example)
    set_worker(doc, 0, POREP, 4, 1e12)
    deriver = ExtensionDeriver(clock=clock)
    deriver.observe(decode(doc))
    assert busy(deriver.extensions())[0] == pytest.approx(example["uptime_secs"])
