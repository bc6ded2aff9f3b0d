"""The stall watchdog's rules on a virtual clock: documents in, stall decisions out."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from cuzkd.status.document import (
    DURATION_BUCKETS,
    Allocations,
    Buffers,
    Counters,
    Extensions,
    GpuWorker,
    Histogram,
    Memory,
    Partition,
    Pipeline,
    StaleJob,
    StatusDocument,
    Synthesis,
)
from cuzkd.supervisor.core.stall import (
    MIN_BUSY_LIMIT,
    STARTUP_FACTOR,
    StallWatch,
    busy_limit,
    gpu_p99,
)

AFTER = 10.0


def doc(states: list[str] | None = None, *, job: str = "j1", kind: str = "porep-c2",
        queue: int = 0, workers: list[GpuWorker] | None = None) -> StatusDocument:
    pipelines = [] if states is None else [Pipeline(
        job_id=job, proof_kind=kind, started_secs_ago=1.0, total_partitions=len(states),
        partitions_done=states.count("done"),
        partitions=[Partition(index=i, state=s, synth_ms=None, gpu_ms=None)  # type: ignore[arg-type]
                    for i, s in enumerate(states)])]
    return StatusDocument(
        uptime_secs=1.0, memory=Memory(total_bytes=1, used_bytes=0, available_bytes=1),
        synthesis=Synthesis(max_concurrent=1, active=0), pipelines=pipelines,
        gpu_workers=workers or [], allocations=Allocations(srs=[], pce=[]),
        counters=Counters(total_completed=0, total_failed=0, completed_by_kind={},
                          failed_by_kind={}, queue_depth=queue),
        buffers=Buffers(synth_in_flight=0, provers_in_flight=0, aux_in_flight=0,
                        shells_in_flight=0, pending_handles=0))


def proving(worker: int, job: str, partition: int, busy: float) -> GpuWorker:
    return GpuWorker(worker_id=worker, gpu_ordinal=0, state="proving", current_job=job,
                     current_partition=partition, busy_secs=busy)


def histogram(values: list[float]) -> Histogram:
    counts = [sum(1 for v in values if v <= b) for b in DURATION_BUCKETS]
    return Histogram(bounds=list(DURATION_BUCKETS), bucket_counts=counts, count=len(values),
                     sum=sum(values))


def ext(transitions: int = 0, gpu: dict[str, Histogram] | None = None) -> Extensions:
    return Extensions(phase_transitions={"porep-c2": {"done": transitions}}, worker_busy=[],
                      synth_duration_seconds={}, gpu_duration_seconds=gpu or {},
                      jobs_in_flight=1)


def run(watch: StallWatch, polls: list[tuple[float, StatusDocument]],
        extensions: Extensions | None = None) -> list[tuple[float, Any]]:
    """Feed (now, doc) polls; return the (now, evidence) of each stall onset."""
    return [(now, ev) for now, d in polls
            if (ev := watch.observe(now, d, extensions)) is not None]


def progressing_then(frozen: list[str], t_freeze: float) -> list[tuple[float, StatusDocument]]:
    """One poll a second: the first partition moves each second until t_freeze, then not."""
    cycle = ["pending", "synthesizing", "synth_done", "gpu"]
    polls = []
    for t in range(int(t_freeze) + 1):
        polls.append((float(t), doc([cycle[t % 4], "pending"])))
    return [*polls, *((t_freeze + dt, doc(frozen)) for dt in range(1, 60))]


def test_frozen_partitions_in_gpu_stall_stall_after_past_the_last_progress() -> None:
    watch = StallWatch(AFTER)
    watch.started(0.0)
    onsets = run(watch, progressing_then(["gpu", "gpu"], 5.0))
    # last progress at t=6 (the frozen document differs from the t=5 one), stall at 6 + AFTER
    assert [t for t, _ in onsets] == [6.0 + AFTER]
    evidence = onsets[0][1]
    assert evidence.reason == "no_progress"
    assert evidence.phases["gpu"] == 2
    assert evidence.since_progress_seconds == AFTER
    assert watch.stalled and watch.stalls_total == 1


def test_no_progress_since_start_gets_the_startup_grace() -> None:
    watch = StallWatch(AFTER)
    watch.started(0.0)
    onsets = run(watch, [(float(t), doc(["synthesizing"])) for t in range(60)])
    assert [t for t, _ in onsets] == [STARTUP_FACTOR * AFTER]


def test_idle_engine_never_stalls() -> None:
    watch = StallWatch(AFTER)
    watch.started(0.0)
    assert run(watch, [(float(t), doc()) for t in range(0, 10_000, 7)]) == []
    assert run(watch, [(10_000.0 + t, doc(["done", "failed"])) for t in range(100)]) == []
    assert not watch.stalled


def test_slow_steady_progress_never_stalls() -> None:
    """A transition every 0.9 × stall_after, for a long time: never a stall."""
    watch = StallWatch(AFTER)
    watch.started(0.0)
    states = ["pending", "synthesizing", "synth_done", "gpu", "done"]
    polls = []
    for step in range(200):
        t = step * 0.9 * AFTER
        job = f"j{step // 5}"
        polls.append((t, doc([states[step % 5]], job=job)))
        polls.append((t + 0.5 * AFTER, doc([states[step % 5]], job=job)))
    assert run(watch, polls) == []


def test_work_appearing_after_a_long_idle_starts_the_clock_then() -> None:
    watch = StallWatch(AFTER)
    watch.started(0.0)
    polls = [(float(t), doc(["pending"] if t == 0 else ["synthesizing"])) for t in range(2)]
    polls += [(float(t), doc()) for t in range(2, 1000)]  # idle a long time after progress
    polls += [(1000.0 + t, doc(["pending"], job="j2")) for t in range(30)]
    onsets = run(watch, polls)
    assert [t for t, _ in onsets] == [1000.0 + AFTER]


def test_extension_counters_catch_transitions_between_polls() -> None:
    """The document looks the same at every poll, but the cumulative counter moves."""
    watch = StallWatch(AFTER)
    watch.started(0.0)
    same = doc(["gpu"])
    onsets = [watch.observe(float(t), same, ext(transitions=t)) for t in range(100)]
    assert not any(onsets)


def test_worker_span_ending_is_progress() -> None:
    watch = StallWatch(AFTER)
    watch.started(0.0)
    polls = []
    for t in range(100):
        # the same partitions listed, but worker 0 moves between them every 5 s
        part = (t // 5) % 2
        polls.append((float(t), doc(["gpu", "gpu"], workers=[proving(0, "j1", part, t % 5)])))
    assert run(watch, polls) == []


def test_stall_is_reported_once_and_clears_on_progress() -> None:
    watch = StallWatch(AFTER)
    watch.started(0.0)
    polls = progressing_then(["gpu"], 1.0)[:40]
    assert len(run(watch, polls)) == 1
    assert watch.stalled
    assert watch.observe(100.0, doc(["done"]), None) is None
    assert not watch.stalled
    assert watch.stalls_total == 1


def test_restart_clears_the_stall_and_the_baseline() -> None:
    watch = StallWatch(AFTER)
    watch.started(0.0)
    run(watch, progressing_then(["gpu"], 1.0))
    assert watch.stalled
    watch.started(100.0)
    assert not watch.stalled
    onsets = run(watch, [(100.0 + t, doc(["gpu"])) for t in range(40)])
    assert [t for t, _ in onsets] == [100.0 + STARTUP_FACTOR * AFTER]
    assert watch.stalls_total == 2


def test_zero_turns_it_off() -> None:
    watch = StallWatch(0.0)
    watch.started(0.0)
    assert run(watch, [(float(t), doc(["gpu"])) for t in range(0, 100_000, 50)]) == []


def test_worker_busy_beyond_the_floor_is_a_stall_despite_other_progress() -> None:
    """Other partitions keep moving, but one worker holds one partition for > 5 min."""
    watch = StallWatch(3600.0)
    watch.started(0.0)
    polls = []
    for t in range(0, 400, 5):
        other = ["pending", "synthesizing", "synth_done"][(t // 5) % 3]
        polls.append((float(t), doc(["gpu", other], workers=[proving(0, "j1", 0, float(t))])))
    onsets = run(watch, polls)
    assert [t for t, _ in onsets] == [MIN_BUSY_LIMIT]
    evidence = onsets[0][1]
    assert evidence.reason == "worker_busy_too_long"
    assert evidence.oldest_busy.worker == 0
    assert evidence.oldest_busy.busy_seconds == MIN_BUSY_LIMIT
    assert evidence.oldest_busy.proof_kind == "porep-c2"


def test_busy_limit_follows_the_kinds_gpu_p99_once_there_are_enough_observations() -> None:
    assert busy_limit(None) == MIN_BUSY_LIMIT
    assert busy_limit(histogram([50.0] * 19)) == MIN_BUSY_LIMIT  # too few observations
    assert gpu_p99(histogram([50.0] * 20)) == 60.0  # the bucket's upper bound
    assert busy_limit(histogram([50.0] * 20)) == 600.0
    assert busy_limit(histogram([1.0] * 100)) == MIN_BUSY_LIMIT
    assert gpu_p99(histogram([1.0] * 98 + [10_000.0] * 2)) == float("inf")
    watch = StallWatch(3600.0)
    watch.started(0.0)
    slow = ext(gpu={"porep-c2": histogram([50.0] * 20)})
    onsets = [t for t in range(0, 700, 10)
              if watch.observe(float(t), doc(["gpu"], workers=[proving(0, "j1", 0, float(t))]),
                               slow) is not None]
    assert onsets == [600]


@pytest.mark.parametrize("queue", [1, 5])
def test_queued_jobs_alone_are_work(queue: int) -> None:
    watch = StallWatch(AFTER)
    watch.started(0.0)
    onsets = run(watch, [(float(t), doc(queue=queue)) for t in range(100)])
    assert [t for t, _ in onsets] == [STARTUP_FACTOR * AFTER]


def test_figures_that_did_not_decode_are_no_work_and_no_progress() -> None:
    """A queue depth or a phase counter the engine served but that did not decode (None):
    the watch neither crashes nor counts them -- frozen partitions still stall, the evidence
    says the queue depth is unknown, and an idle engine stays idle."""
    watch = StallWatch(AFTER)
    watch.started(0.0)
    unknown_queue = msgspec.structs.replace(doc(), counters=msgspec.structs.replace(
        doc().counters, queue_depth=None))
    assert run(watch, [(float(t), unknown_queue) for t in range(100)]) == []
    frozen = msgspec.structs.replace(doc(["gpu"]), counters=unknown_queue.counters)
    unknown_counts = msgspec.structs.replace(ext(), phase_transitions={"porep-c2": {"done": None}})
    onsets = run(watch, [(100.0 + t, frozen) for t in range(100)], unknown_counts)
    assert [t for t, _ in onsets] == [100.0 + AFTER]
    assert onsets[0][1].queue_depth is None


def synthesizing_for(ms: int, *, listed: int = 2) -> StatusDocument:
    """Job j1: partition 0 synthesizing for ``ms`` so far, then pending ones (``listed`` in all)."""
    base = doc(["synthesizing", *["pending"] * (listed - 1)])
    first, *rest = base.pipelines[0].partitions
    pipeline = msgspec.structs.replace(
        base.pipelines[0], partitions=[msgspec.structs.replace(first, synth_ms=ms), *rest])
    return msgspec.structs.replace(base, pipelines=[pipeline, *base.pipelines[1:]])


def test_a_running_phase_growing_is_no_progress_but_a_partition_leaving_unfinished_is() -> None:
    """Unchanged jobs are skipped whole; a changed one is compared phase by phase: elapsed
    milliseconds growing are not progress, an unfinished partition dropped from a job still
    listed is."""
    watch = StallWatch(AFTER)
    watch.started(0.0)
    polls = [(float(t), synthesizing_for(1000 * t)) for t in range(60)]
    assert [t for t, _ in run(watch, polls)] == [STARTUP_FACTOR * AFTER]

    watch = StallWatch(AFTER)
    watch.started(0.0)
    polls = [(0.0, doc(["pending", "pending"]))]  # baseline, then progress at t=1
    polls += [(float(t), synthesizing_for(1000 * t)) for t in range(1, 5)]
    polls += [(float(t), synthesizing_for(1000 * t, listed=1)) for t in range(5, 60)]
    assert [t for t, _ in run(watch, polls)] == [5.0 + AFTER]


def test_failed_work_is_neither_work_nor_progress() -> None:
    """A plain cuzk lists a failed job for good (partitions stuck in gpu, a worker left
    proving): with the deriver's stale job and phantom worker that engine is idle, never
    stalled; a real job frozen beside the leftover still stalls, and so does a job stale only
    for making no progress (a hung engine's)."""
    leftover = msgspec.structs.replace(ext(), stale_jobs=[StaleJob(
        job_id="j1", proof_kind="porep-c2", age_secs=1.0, idle_secs=0.0,
        failed_partitions=1)], phantom_busy_workers=[0])
    left = doc(["failed", "gpu"], workers=[proving(0, "j1", 1, 400.0)])
    watch = StallWatch(AFTER)
    watch.started(0.0)
    assert run(watch, [(float(t), left) for t in range(1000)], leftover) == []
    assert run(StallWatch(AFTER), [(float(t), left) for t in range(1000)], ext()) != []
    frozen = msgspec.structs.replace(left, pipelines=[
        *left.pipelines, *doc(["gpu"], job="j2").pipelines])
    watch = StallWatch(AFTER)
    watch.started(0.0)
    onsets = run(watch, [(float(t), frozen) for t in range(100)], leftover)
    assert [(t, ev.reason, ev.phases["gpu"]) for t, ev in onsets] == [
        (STARTUP_FACTOR * AFTER, "no_progress", 1)]
    hung = msgspec.structs.replace(leftover, stale_jobs=[msgspec.structs.replace(
        leftover.stale_jobs[0], failed_partitions=0)], phantom_busy_workers=[])
    watch = StallWatch(AFTER)
    watch.started(0.0)
    assert [t for t, _ in run(watch, [(float(t), doc(["gpu"])) for t in range(100)], hung)] \
        == [STARTUP_FACTOR * AFTER]
