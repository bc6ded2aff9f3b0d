"""The collector over samples built from cuzk's example document and from extensions."""

from __future__ import annotations

import msgspec
import pytest

from cuzkd import __version__
from cuzkd.gpus import NvmlDevice
from cuzkd.metrics.sample import SupervisorSample
from cuzkd.states import WORK_LOST_REASONS, DrainResult, State, StopReason
from cuzkd.status.document import (
    COUNTED_PHASES,
    JOB_DURATION_BUCKETS,
    GpuWorker,
    Histogram,
    PartitionState,
    StaleJob,
)


def one(engines, **fields):
    return SupervisorSample(engines=engines, zombies_reaped_total=fields.pop("zombies", 0),
                            **fields)


def test_example_document_values(example_status, make_engine, scrape):
    s = scrape(one([make_engine("e0", status=example_status)]))
    # workers: 0 proving partition 4 for 1.21 s, 1 idle
    assert s.get_value("cuzk_gpu_worker_busy", engine="e0", worker="0", gpu="0") == 1
    assert s.get_value("cuzk_gpu_worker_busy", engine="e0", worker="1", gpu="0") == 0
    assert s.get_value("cuzk_gpu_worker_current_busy_seconds", engine="e0", worker="0",
                       gpu="0") == pytest.approx(1.21)
    assert s.get_value("cuzk_gpu_worker_current_busy_seconds", engine="e0", worker="1",
                       gpu="0") == 0
    # partitions by phase: porep-c2 4 done, 1 gpu, 1 synth_done, 3 synthesizing, 1 pending
    porep = {"pending": 1, "synthesizing": 3, "synth_done": 1, "gpu": 1, "done": 4, "failed": 0}
    snap = dict.fromkeys(PartitionState, 0) | {"done": 16}
    for kind, expected in (("porep-c2", porep), ("snap-update", snap)):
        for phase, count in expected.items():
            assert s.get_value("cuzk_partitions", engine="e0", proof_kind=kind,
                               phase=phase) == count, (kind, phase)
    assert s.get_value("cuzk_memory_budget_total_bytes", engine="e0") == 270582939648
    assert s.get_value("cuzk_memory_budget_used_bytes", engine="e0") == 101468602368
    assert s.get_value("cuzk_memory_budget_available_bytes", engine="e0") == 169114337280
    assert s.get_value("cuzk_synthesis_active", engine="e0") == 3
    assert s.get_value("cuzk_synthesis_max_concurrent", engine="e0") == 19
    assert s.get_value("cuzk_jobs_completed_total", engine="e0", proof_kind="porep-c2") == 41
    assert s.get_value("cuzk_jobs_completed_total", engine="e0", proof_kind="snap-update") == 16
    assert s.get_value("cuzk_jobs_failed_total", engine="e0", proof_kind="porep-c2") == 1
    assert s.get_value("cuzk_jobs_failed_total", engine="e0", proof_kind="snap-update") == 0
    assert s.get_value("cuzk_queue_depth", engine="e0") == 2
    # without extensions: jobs with an unfinished partition (the porep-c2 one)
    assert s.get_value("cuzk_jobs_in_flight", engine="e0") == 1
    assert s.get_value("cuzk_allocation_bytes", engine="e0", kind="srs",
                       circuit="porep-32g") == 47244640256
    assert s.get_value("cuzk_allocation_bytes", engine="e0", kind="pce",
                       circuit="porep-32g") == 27917287424
    for buffer, count in {"synth": 4, "provers": 2}.items():
        assert s.get_value("cuzk_buffers_in_flight", engine="e0", buffer=buffer) == count
    # a plain cuzk never decrements aux and shells: counts of buffers put in flight
    for buffer, count in {"aux": 1, "shells": 0}.items():
        assert s.get_value("cuzk_buffers_started_total", engine="e0", buffer=buffer) == count
        assert ("cuzk_buffers_in_flight", (("buffer", buffer), ("engine", "e0"))) not in s
    assert s.get_value("cuzk_pending_handles", engine="e0") == 1
    assert s.get_value("cuzk_engine_uptime_seconds", engine="e0") == pytest.approx(812.44)
    # extension-only families are absent without extensions
    assert "cuzk_gpu_worker_busy_seconds_total" not in s.of_engine("e0")


def test_extensions_values(example_status, example_extensions, make_engine, scrape):
    s = scrape(one([make_engine("e0", status=example_status, extensions=example_extensions)]))
    assert s.get_value("cuzk_gpu_worker_busy_seconds_total", engine="e0", worker="0",
                       gpu="0") == 512.5
    assert s.get_value("cuzk_gpu_worker_busy_seconds_total", engine="e0", worker="1",
                       gpu="0") == 498.25
    assert s.get_value("cuzk_partition_phase_transitions_total", engine="e0",
                       proof_kind="porep-c2", phase="gpu") == 415
    # every counted phase of every kind, 0 where the engine has no entry
    assert s.get_value("cuzk_partition_phase_transitions_total", engine="e0",
                       proof_kind="snap-update", phase="failed") == 0
    assert len(s.named("cuzk_partition_phase_transitions_total")) == 2 * len(COUNTED_PHASES)
    # histograms: cumulative le buckets, +Inf, count, sum
    assert s.get_value("cuzk_partition_synth_duration_seconds_bucket", engine="e0",
                       proof_kind="porep-c2", le="30.0") == 0
    assert s.get_value("cuzk_partition_synth_duration_seconds_bucket", engine="e0",
                       proof_kind="porep-c2", le="45.0") == 3
    assert s.get_value("cuzk_partition_synth_duration_seconds_bucket", engine="e0",
                       proof_kind="porep-c2", le="+Inf") == 3
    assert s.get_value("cuzk_partition_synth_duration_seconds_count", engine="e0",
                       proof_kind="porep-c2") == 3
    assert s.get_value("cuzk_partition_synth_duration_seconds_sum", engine="e0",
                       proof_kind="porep-c2") == pytest.approx(104.3)
    assert s.get_value("cuzk_partition_gpu_duration_seconds_bucket", engine="e0",
                       proof_kind="snap-update", le="0.5") == 1
    # extensions win over counting pipelines (unpartitioned jobs are not listed)
    assert s.get_value("cuzk_jobs_in_flight", engine="e0") == 3
    assert s.get_value("cuzk_gpu_memory_used_bytes", engine="e0", gpu="0") == 60 * 2**30
    assert s.get_value("cuzk_gpu_memory_total_bytes", engine="e0", gpu="0") == 80 * 2**30
    assert s.get_value("cuzk_gpu_memory_pool_bytes", engine="e0", gpu="0") == 50 * 2**30
    assert s.get_value("cuzk_gpu_info", engine="e0", gpu="0", name="NVIDIA H100",
                       uuid="GPU-5f1c7a2e-0b3d-4c8e-9a61-2d4f8e6b1c03") == 1
    assert s.get_value("cuzk_engine_backend_info", engine="e0", backend="cupy") == 1


def test_document_own_extensions_are_used(example_status, example_extensions, make_engine,
                                          scrape):
    doc = msgspec.structs.replace(example_status, cuzkd_extensions=example_extensions)
    s = scrape(one([make_engine("e0", status=doc)]))
    assert s.get_value("cuzk_gpu_worker_busy_seconds_total", engine="e0", worker="0",
                       gpu="0") == 512.5
    # the reference engine's aux and shells are true in-flight counts
    assert s.get_value("cuzk_buffers_in_flight", engine="e0", buffer="aux") == 1
    assert "cuzk_buffers_started_total" not in s.of_engine("e0")


def test_missing_status_drops_only_that_engines_cuzk_series(example_status, example_extensions,
                                                            make_engine, scrape):
    s = scrape(one([
        make_engine("up", status=example_status, extensions=example_extensions),
        make_engine("down", status=None, extensions=example_extensions, fetch_errors_total=4),
    ]))
    assert s.get_value("cuzkd_engine_up", engine="up") == 1
    assert s.get_value("cuzkd_engine_up", engine="down") == 0
    assert s.get_value("cuzkd_status_fetch_errors_total", engine="down") == 4
    assert {n for n in s.of_engine("down") if n.startswith("cuzk_")} == set()
    up = s.of_engine("up")
    assert {"cuzk_gpu_worker_busy", "cuzk_partitions", "cuzk_gpu_worker_busy_seconds_total",
            "cuzk_memory_budget_used_bytes"} <= up


def test_engine_not_running_is_down_even_with_a_document(example_status, make_engine, scrape):
    s = scrape(one([make_engine("e0", state="backoff", start_time_seconds=None,
                                resident_memory_bytes=None, cpu_seconds_total=None,
                                status=example_status)]))
    assert s.get_value("cuzkd_engine_up", engine="e0") == 0
    assert not s.named("cuzkd_engine_start_time_seconds")
    assert not s.named("cuzkd_engine_resident_memory_bytes")
    assert not s.named("cuzkd_engine_cpu_seconds_total")


@pytest.mark.parametrize("current", list(State))
def test_state_is_one_hot(current, make_engine, scrape):
    """``cuzkd_engine_state`` has one series for every engine state of :mod:`cuzkd.states`."""
    s = scrape(one([make_engine("e0", state=current)]))
    states = {dict(labels)["state"]: v for labels, v in s.named("cuzkd_engine_state").items()}
    assert states == {str(state): (1 if state == current else 0) for state in State}


def test_every_stop_reason_and_drain_result_is_exported_from_zero(make_engine, scrape):
    """The stop and drain counters exist at 0 for every word of :mod:`cuzkd.states` (alerts
    on ``increase()`` see the first one), and count what the engine reported."""
    s = scrape(one([make_engine("e0", stop_inflight_partitions_total={"reload": 3},
                                drains_total={"timeout": 2})]))
    lost = {dict(labels)["reason"]: v for labels, v in
            s.named("cuzkd_engine_stop_inflight_partitions_total").items()}
    assert lost == {str(reason): (3 if reason is StopReason.RELOAD else 0)
                    for reason in WORK_LOST_REASONS}
    drains = {dict(labels)["result"]: v for labels, v in
              s.named("cuzkd_engine_drains_total").items()}
    assert drains == {str(result): (2 if result is DrainResult.TIMEOUT else 0)
                      for result in DrainResult}


def test_supervisor_families(make_engine, scrape):
    s = scrape(one(
        [make_engine("e0", restarts_total=3, exits_total={"exit_1": 2, "signal_SIGKILL": 1},
                     release="r-2", descendants_killed_total=4)],
        zombies=7, swaps_total={"ok": 2}, rollbacks_total={"failed": 1},
        active_release="r-2"))
    assert s.get_value("cuzkd_build_info", version=__version__) == 1
    assert s.get_value("cuzkd_engine_restarts_total", engine="e0") == 3
    assert s.get_value("cuzkd_engine_descendants_killed_total", engine="e0") == 4
    assert s.get_value("cuzkd_engine_exits_total", engine="e0", cause="exit_1") == 2
    assert s.get_value("cuzkd_engine_exits_total", engine="e0", cause="signal_SIGKILL") == 1
    assert s.get_value("cuzkd_engine_start_time_seconds", engine="e0") == 1_700_000_000
    assert s.get_value("cuzkd_engine_resident_memory_bytes", engine="e0") == 2**30
    assert s.get_value("cuzkd_engine_cpu_seconds_total", engine="e0") == 12.5
    assert s.get_value("cuzkd_status_fetch_duration_seconds", engine="e0") == 0.003
    assert s.get_value("cuzkd_zombies_reaped_total") == 7
    assert s.named("cuzkd_binary_swaps_total") == {
        (("result", "ok"),): 2, (("result", "refused"),): 0, (("result", "rolled_back"),): 0,
        (("result", "cancelled"),): 0}
    assert s.named("cuzkd_binary_rollbacks_total") == {
        (("result", "ok"),): 0, (("result", "failed"),): 1, (("result", "cancelled"),): 0}
    assert s.get_value("cuzkd_binary_release_info", release="r-2") == 1
    assert s.get_value("cuzkd_engine_release_info", engine="e0", release="r-2") == 1


def test_no_release_no_release_info(make_engine, scrape):
    s = scrape(one([make_engine("e0")]))
    assert not s.named("cuzkd_binary_release_info")
    assert not s.named("cuzkd_engine_release_info")
    assert len(s.named("cuzkd_binary_swaps_total")) == 4
    assert len(s.named("cuzkd_binary_rollbacks_total")) == 3


def test_duplicates_do_not_break_the_exposition(example_status, example_extensions, make_engine,
                                                scrape):
    """Duplicate workers, jobs, devices and engine names give one series each (``scrape``
    fails on a duplicate series)."""
    worker = example_status.gpu_workers[0]
    ghost = GpuWorker(worker_id=worker.worker_id, gpu_ordinal=3, state="idle", current_job=None,
                      current_partition=None, busy_secs=None)
    doc = msgspec.structs.replace(
        example_status,
        gpu_workers=[*example_status.gpu_workers, worker, ghost],
        pipelines=[*example_status.pipelines, example_status.pipelines[0]],
    )
    ext = msgspec.structs.replace(
        example_extensions,
        worker_busy=[*example_extensions.worker_busy, *example_extensions.worker_busy],
        gpu_devices=[*example_extensions.gpu_devices, *example_extensions.gpu_devices],
    )
    s = scrape(one([make_engine("e0", status=doc, extensions=ext),
                    make_engine("e0", status=None)]))
    assert s.get_value("cuzkd_engine_up", engine="e0") == 1  # first entry wins
    assert len(s.named("cuzk_gpu_worker_busy")) == 2
    assert s.get_value("cuzk_partitions", engine="e0", proof_kind="porep-c2", phase="done") == 4


def test_malformed_histogram_is_dropped_not_fatal(example_status, example_extensions,
                                                  make_engine, scrape):
    bad = msgspec.structs.replace(example_extensions.gpu_duration_seconds["porep-c2"], count=0)
    ext = msgspec.structs.replace(
        example_extensions,
        gpu_duration_seconds={**example_extensions.gpu_duration_seconds, "porep-c2": bad})
    s = scrape(one([make_engine("e0", status=example_status, extensions=ext)]))
    kinds = {dict(labels)["proof_kind"]
             for labels in s.named("cuzk_partition_gpu_duration_seconds_count")}
    assert kinds == {"snap-update"}


def test_config_reload_families(make_engine, scrape):
    s = scrape(one([make_engine("e0")], config_reload_ok=False,
                   config_reload_success_time=1_700_000_123.5))
    assert s.get_value("cuzkd_config_last_reload_successful") == 0
    assert s.get_value("cuzkd_config_last_reload_success_timestamp_seconds") == 1_700_000_123.5
    s = scrape(one([make_engine("e0")]))
    assert s.get_value("cuzkd_config_last_reload_successful") == 1
    assert not s.named("cuzkd_config_last_reload_success_timestamp_seconds")


def test_log_lines_dropped_by_reason_every_reason_always_present(make_engine, scrape):
    s = scrape(one([make_engine("e0")], log_lines_dropped_total={"queue_full": 12}))
    assert s.named("cuzkd_log_lines_dropped_total") == {
        (("reason", "queue_full"),): 12, (("reason", "write_error"),): 0,
        (("reason", "upgrade"),): 0}
    assert len(scrape(one([make_engine("e0")])).named("cuzkd_log_lines_dropped_total")) == 3


def test_metrics_connections_closed_by_reason_all_always_present(make_engine, scrape):
    s = scrape(one([make_engine("e0")], metrics_connections_closed_total={"idle": 3}))
    assert s.named("cuzkd_metrics_connections_closed_total") == {
        (("reason", "refused"),): 0, (("reason", "idle"),): 3, (("reason", "deadline"),): 0,
        (("reason", "send_budget"),): 0}


def test_an_engine_without_status_url_is_up_while_running(make_engine, scrape):
    s = scrape(one([make_engine("p", state="running", status=None, status_polled=False),
                    make_engine("q", state="starting", status=None, status_polled=False)]))
    assert s.get_value("cuzkd_engine_up", engine="p") == 1
    assert s.get_value("cuzkd_engine_up", engine="q") == 0


def test_job_duration_histogram_per_proof_kind(example_status, example_extensions, make_engine,
                                               scrape):
    jobs = Histogram(bounds=list(JOB_DURATION_BUCKETS),
                     bucket_counts=[0, 0, 0, 0, 1, 2] + [3] * 13, count=3, sum=49.5)
    ext = msgspec.structs.replace(example_extensions, job_duration_seconds={"winning-post": jobs})
    s = scrape(one([make_engine("e0", status=example_status, extensions=ext)]))
    assert s.get_value("cuzk_job_duration_seconds_bucket", engine="e0", proof_kind="winning-post",
                       le="20.0") == 2
    assert s.get_value("cuzk_job_duration_seconds_bucket", engine="e0", proof_kind="winning-post",
                       le="3600.0") == 3
    assert s.get_value("cuzk_job_duration_seconds_count", engine="e0",
                       proof_kind="winning-post") == 3
    assert s.get_value("cuzk_job_duration_seconds_sum", engine="e0",
                       proof_kind="winning-post") == 49.5


def test_stall_families(make_engine, scrape):
    s = scrape(one([make_engine("e0", stalls_total=2, stalled=True), make_engine("e1")]))
    assert s.get_value("cuzkd_engine_stalls_total", engine="e0") == 2
    assert s.get_value("cuzkd_engine_stalled", engine="e0") == 1
    assert s.get_value("cuzkd_engine_stalls_total", engine="e1") == 0
    assert s.get_value("cuzkd_engine_stalled", engine="e1") == 0


def test_proof_deadlines_family(make_engine, scrape):
    s = scrape(one([make_engine("e0")],
                   proof_deadlines={"winning-post": 20.0, "window-post": 1200.0}))
    assert s.named("cuzkd_proof_deadline_seconds") == {
        (("proof_kind", "winning-post"),): 20.0, (("proof_kind", "window-post"),): 1200.0}


def test_nvml_gpu_families(make_engine, scrape):
    gpus = [NvmlDevice(index=1, uuid="GPU-bbbb", name="NVIDIA H200", memory_used_bytes=5 * 2**30,
                       memory_total_bytes=141 * 2**30, utilization_ratio=0.75, processes={}),
            NvmlDevice(index=0, uuid="GPU-aaaa", name="NVIDIA H200", memory_used_bytes=0,
                       memory_total_bytes=141 * 2**30, utilization_ratio=None,
                       processes={123: None})]
    s = scrape(one([make_engine("e0")], gpus=gpus))
    assert s.get_value("cuzkd_gpu_memory_used_bytes", gpu="1") == 5 * 2**30
    assert s.get_value("cuzkd_gpu_memory_total_bytes", gpu="0") == 141 * 2**30
    assert s.named("cuzkd_gpu_utilization_ratio") == {(("gpu", "1"),): 0.75}
    assert s.get_value("cuzkd_gpu_info", gpu="0", name="NVIDIA H200", uuid="GPU-aaaa") == 1
    assert not scrape(one([make_engine("e0")])).named("cuzkd_gpu_memory_used_bytes")


def test_failed_work_is_not_in_flight_queued_synthesizing_or_busy(
        example_status, example_extensions, make_engine, scrape):
    """The deriver's stale jobs and phantom-busy workers (a plain cuzk's failed work): the
    stale porep-c2 job's partitions leave cuzk_partitions and what it holds of synthesis.active
    leaves cuzk_synthesis_active; worker 0, shown proving, is not busy."""
    [porep] = [p for p in example_status.pipelines if p.proof_kind == "porep-c2"]
    ext = msgspec.structs.replace(
        example_extensions,
        stale_jobs=[StaleJob(job_id=porep.job_id, proof_kind="porep-c2", age_secs=900.0,
                             idle_secs=700.0, failed_partitions=0)],
        phantom_busy_workers=[0],
        phantom_busy_total={"job_not_listed": 0, "job_stale": 2, "partition_not_gpu": 1})
    s = scrape(one([make_engine("e0", status=example_status, extensions=ext)]))
    assert s.get_value("cuzk_stale_jobs", engine="e0", proof_kind="porep-c2") == 1
    assert s.get_value("cuzk_stale_jobs", engine="e0", proof_kind="snap-update") == 0
    assert s.get_value("cuzk_gpu_worker_phantom_busy_total", engine="e0", reason="job_stale") == 2
    assert s.get_value("cuzk_gpu_worker_busy", engine="e0", worker="0", gpu="0") == 0
    assert s.get_value("cuzk_gpu_worker_current_busy_seconds", engine="e0", worker="0",
                       gpu="0") == 0
    for phase in PartitionState:
        assert s.get_value("cuzk_partitions", engine="e0", proof_kind="porep-c2",
                           phase=phase) == 0
    assert s.get_value("cuzk_synthesis_active", engine="e0") == 0  # its 3 synthesizing
    clean = scrape(one([make_engine("e0", status=example_status, extensions=example_extensions)]))
    assert clean.get_value("cuzk_synthesis_active", engine="e0") == 3
    assert clean.get_value("cuzk_gpu_worker_busy", engine="e0", worker="0", gpu="0") == 1


def test_a_cuzk_engines_real_synthesis_capacity_beside_max_concurrent(
        example_status, example_extensions, make_engine, scrape):
    """From its config's max_parallel_synthesis (cuzk's default without a cuzk file) and its
    budget (252 GiB: 18 by 14 GiB); cuzkd's engine reports its own cap."""
    own = msgspec.structs.replace(example_status, cuzkd_extensions=example_extensions)
    s = scrape(one([make_engine("four", status=example_status, max_parallel_synthesis=4),
                    make_engine("dflt", status=example_status),
                    make_engine("ref", status=own)]))
    assert s.get_value("cuzk_synthesis_capacity", engine="four") == 4
    assert s.get_value("cuzk_synthesis_capacity", engine="dflt") == 18
    assert s.get_value("cuzk_synthesis_max_concurrent", engine="dflt") == 19
    assert s.get_value("cuzk_synthesis_capacity", engine="ref") == 19


def test_an_empty_srs_list_is_filled_from_the_held_one(example_status, example_extensions,
                                                       make_engine, scrape):
    """The documented exception to "never a stale value": a plain cuzk's [] (SRS manager
    busy) shows the deriver's held list; the engine's own non-empty list always wins."""
    held = list(example_status.allocations.srs)
    busy = msgspec.structs.replace(example_status, allocations=msgspec.structs.replace(
        example_status.allocations, srs=[]))
    ext = msgspec.structs.replace(example_extensions, held_srs=held)
    s = scrape(one([make_engine("e0", status=busy, extensions=ext)]))
    assert s.get_value("cuzk_allocation_bytes", engine="e0", kind="srs",
                       circuit="porep-32g") == 47244640256
    s = scrape(one([make_engine("e0", status=busy, extensions=example_extensions)]))
    assert ("cuzk_allocation_bytes", (("circuit", "porep-32g"), ("engine", "e0"),
                                      ("kind", "srs"))) not in s
