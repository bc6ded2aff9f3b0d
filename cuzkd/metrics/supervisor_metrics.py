"""The ``cuzkd_*`` families: the supervisor's view of its engines, releases and itself.

These exist for every configured engine whether or not it answers, which is what makes
``cuzkd_engine_up == 0`` and ``cuzkd_engine_state`` usable in alerts when the ``cuzk_*`` series
of an engine are gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from cuzkd import __version__
from cuzkd.gpus import NvmlDevice
from cuzkd.kinds import ProofKind
from cuzkd.labelbudget import DEFAULT_LIMITS, MAX_VALUE_LENGTH
from cuzkd.log.queue import DropReason
from cuzkd.metrics.sample import EngineSample, SupervisorSample
from cuzkd.metrics.tally import first_by
from cuzkd.states import (
    ROLLBACK_RESULTS,
    SWAP_RESULTS,
    WORK_LOST_REASONS,
    ConnectionClose,
    DrainResult,
    State,
)
from cuzkd.status.salvage import FieldErrorReason


def supervisor_families(sample: SupervisorSample, engines: Sequence[EngineSample]) -> list[Metric]:
    """All ``cuzkd_*`` families; ``engines`` is ``sample.engines`` with duplicate names removed."""
    g, c = GaugeMetricFamily, CounterMetricFamily
    e = ["engine"]
    up = g("cuzkd_engine_up",
           "1 when the engine process runs and its status answered for this scrape "
           "(an engine without status_url: while it is running).", labels=e)
    state = g("cuzkd_engine_state", "1 for the engine's current supervisor state, else 0.",
              labels=["engine", "state"])
    restarts = c("cuzkd_engine_restarts_total", "Times the supervisor restarted the engine.",
                 labels=e)
    exits = c("cuzkd_engine_exits_total",
              "Engine process exits by cause: stopped, swap, unhealthy, stalled, "
              "start_timeout, oom_killed, core_dumped, signal_NAME, daemonized, exit_N; for cuzk "
              "engines panic (101), error (1) and usage (2) instead of those exit_N.",
              labels=["engine", "cause"])
    stalls = c("cuzkd_engine_stalls_total",
               "Stalls the watchdog declared: work and no progress for stall_after, or a "
               "worker busy on one partition far beyond its proof kind's GPU p99.", labels=e)
    stalled = g("cuzkd_engine_stalled", "1 while the engine is stalled, else 0.", labels=e)
    start = g("cuzkd_engine_start_time_seconds",
              "Unix time the engine's current process started.", labels=e)
    rss = g("cuzkd_engine_resident_memory_bytes",
            "Resident memory of the engine's whole process tree.", labels=e)
    cpu = c("cuzkd_engine_cpu_seconds_total",
            "CPU time (user + system) of the engine's whole process tree.", labels=e)
    fetch_duration = g("cuzkd_status_fetch_duration_seconds",
                       "Duration of the last status fetch from the engine.", labels=e)
    fetch_errors = c("cuzkd_status_fetch_errors_total",
                     "Status fetches that failed, timed out or returned a malformed document "
                     "(not those nothing answered in a start: before the process's first "
                     "answer, within start_timeout).", labels=e)
    first_answer = g("cuzkd_engine_first_answer_seconds",
                     "Seconds from the spawn of the engine's process to its status's first "
                     "answer: how long its start took (the last process that answered).",
                     labels=e)
    field_errors = c("cuzkd_status_field_errors_total",
                     "Values of decoded status documents left out because they did not decode, "
                     f"by reason ({', '.join(FieldErrorReason)}); the rest of each document "
                     "is exported.", labels=["engine", "reason"])
    descendants_killed = c(
        "cuzkd_engine_descendants_killed_total",
        "Descendants of the engine the supervisor stopped because they outlived it.", labels=e)
    stop_inflight = c(
        "cuzkd_engine_stop_inflight_partitions_total",
        "Partitions in flight (synthesizing, synth_done, gpu) when the supervisor stopped the "
        "engine, by reason (operator, reload, swap, stall, shutdown): work lost to restarts.",
        labels=["engine", "reason"])
    jobs_lost = c(
        "cuzkd_engine_jobs_lost_total",
        "Jobs the engine held (in flight in /status; for cuzk also queued or in progress in "
        "GetStatus, PoSt included) when the supervisor stopped it, by proof kind: whole proofs "
        "the client must redo.", labels=["engine", "kind"])
    drains = c("cuzkd_engine_drains_total",
               "Drains of the stop sequence by result: clean (in-flight work ended first) or "
               "timeout (drain_timeout elapsed).", labels=["engine", "result"])
    labels_dropped = c(
        "cuzkd_label_values_dropped_total",
        "Label values of the engine's series left out because its budget for the label "
        f"({', '.join(DEFAULT_LIMITS)}) was full, or the value longer than "
        f"{MAX_VALUE_LENGTH} characters; "
        "each value counts once per scrape that left it out.", labels=["engine", "label"])
    loop_failures = c("cuzkd_engine_health_loop_failures_total",
                      "Times the engine's health loop died of an error and was started again "
                      "(a bug or a document nobody foresaw; the engine stays supervised).",
                      labels=e)
    output_lines = c("cuzkd_engine_output_dropped_lines_total",
                     "Lines of the engine's output its output limits kept from the log "
                     "(read and counted, not logged).", labels=e)
    output_bytes = c("cuzkd_engine_output_dropped_bytes_total",
                     "Bytes of the engine's output not logged: lines its output limits kept "
                     "from the log, and the rest of lines cut at the line length limit.",
                     labels=e)
    release = InfoMetricFamily("cuzkd_engine_release",
                               "Release the engine's running process executes.", labels=e)
    for engine in engines:
        name = [engine.name]
        running = engine.start_time_seconds is not None
        answered = (engine.status is not None if engine.status_polled
                    else engine.state == State.RUNNING)
        up.add_metric(name, 1 if running and answered else 0)
        for candidate in State:
            state.add_metric([engine.name, candidate], 1 if engine.state == candidate else 0)
        restarts.add_metric(name, engine.restarts_total)
        stalls.add_metric(name, engine.stalls_total)
        stalled.add_metric(name, 1 if engine.stalled else 0)
        for cause, count in sorted(engine.exits_total.items()):
            exits.add_metric([engine.name, cause], count)
        if engine.start_time_seconds is not None:
            start.add_metric(name, engine.start_time_seconds)
        if engine.resident_memory_bytes is not None:
            rss.add_metric(name, engine.resident_memory_bytes)
        if engine.cpu_seconds_total is not None:
            cpu.add_metric(name, engine.cpu_seconds_total)
        if engine.fetch_duration_seconds is not None:
            fetch_duration.add_metric(name, engine.fetch_duration_seconds)
        fetch_errors.add_metric(name, engine.fetch_errors_total)
        if engine.first_answer_seconds is not None:
            first_answer.add_metric(name, engine.first_answer_seconds)
        for why in FieldErrorReason:
            field_errors.add_metric([engine.name, why],
                                    engine.status_field_errors_total.get(why, 0))
        descendants_killed.add_metric(name, engine.descendants_killed_total)
        for reason in WORK_LOST_REASONS:
            stop_inflight.add_metric([engine.name, reason],
                                     engine.stop_inflight_partitions_total.get(reason, 0))
        for kind in (*ProofKind, *sorted(set(engine.jobs_lost_total) - set(ProofKind))):
            jobs_lost.add_metric([engine.name, kind], engine.jobs_lost_total.get(kind, 0))
        for result in DrainResult:
            drains.add_metric([engine.name, result], engine.drains_total.get(result, 0))
        loop_failures.add_metric(name, engine.health_loop_failures_total)
        output_lines.add_metric(name, engine.output_dropped_lines_total)
        output_bytes.add_metric(name, engine.output_dropped_bytes_total)
        dropped = engine.labels.dropped_total if engine.labels is not None else {}
        for label in DEFAULT_LIMITS:
            labels_dropped.add_metric([engine.name, label], dropped.get(label, 0))
        if engine.release is not None:
            release.add_metric(name, {"release": engine.release})

    swaps = _by_result(c("cuzkd_binary_swaps_total", "Engine binary swaps by result.",
                         labels=["result"]), SWAP_RESULTS, sample.swaps_total)
    rollbacks = _by_result(c("cuzkd_binary_rollbacks_total",
                             "cuzkd swap --rollback runs by result (failed: refused or undone).",
                             labels=["result"]), ROLLBACK_RESULTS, sample.rollbacks_total)
    active = InfoMetricFamily("cuzkd_binary_release", "The active engine binary release.",
                              labels=[])
    if sample.active_release is not None:
        active.add_metric([], {"release": sample.active_release})
    zombies = c("cuzkd_zombies_reaped_total",
                "Orphaned processes (not engines) the supervisor reaped as PID 1 or subreaper.")
    zombies.add_metric([], sample.zombies_reaped_total)
    reload_ok = g("cuzkd_config_last_reload_successful",
                  "1 when the last config reload (SIGHUP) was applied, 0 when it was refused.")
    reload_ok.add_metric([], 1 if sample.config_reload_ok else 0)
    reload_time = g("cuzkd_config_last_reload_success_timestamp_seconds",
                    "Unix time of the last successful config load (start or reload).")
    if sample.config_reload_success_time is not None:
        reload_time.add_metric([], sample.config_reload_success_time)
    deadlines = g("cuzkd_proof_deadline_seconds",
                  "Job latency deadline per proof kind ([metrics] proof_deadlines); the "
                  "proof-latency alert compares each kind's p99 job duration with it.",
                  labels=["proof_kind"])
    for kind, limit in sorted(sample.proof_deadlines.items()):
        deadlines.add_metric([kind], limit)
    freezes = c("cuzkd_supervisor_freezes_total",
                "Times the supervisor itself did not run for a while (SIGSTOP, a VM pause, a "
                "blocked write); that time is not counted against any engine's deadlines.")
    freezes.add_metric([], sample.freezes_total)
    frozen = c("cuzkd_supervisor_frozen_seconds_total",
               "Seconds the supervisor did not run, over all its freezes.")
    frozen.add_metric([], sample.frozen_seconds_total)
    log_dropped = _by_result(c("cuzkd_log_lines_dropped_total",
                               "Lines of the supervisor's own log it dropped: queue_full (its "
                               "reader did not keep up), write_error (writing failed) or "
                               "upgrade (still queued when cuzkd upgrade re-executed it).",
                               labels=["reason"]),
                             tuple(DropReason), sample.log_lines_dropped_total)
    connections_closed = _by_result(
        c("cuzkd_metrics_connections_closed_total",
          "Connections of the metrics listener cuzkd closed, by reason: refused (at the "
          "connection limit), idle (no byte moved for 10 s), deadline (a response still being "
          "sent after 120 s), send_budget (its response progressed longest ago when all "
          "responses together held over the send budget).", labels=["reason"]),
        tuple(ConnectionClose), sample.metrics_connections_closed_total)
    access = sample.listener_access
    web_reload_ok = g("cuzkd_metrics_web_config_last_reload_successful",
                      "1 when the last re-read of [metrics] web_config (the file, its "
                      "certificate and key, changed) was applied, 0 when it failed and the "
                      "listener kept its last good TLS and auth settings.")
    web_reload_ok.add_metric([], 1 if access.reload_ok else 0)
    auth_refused = c("cuzkd_metrics_auth_refused_total",
                     "Requests to the metrics listener answered 401: no, malformed or wrong "
                     "basic auth credentials.")
    auth_refused.add_metric([], access.auth_refused_total)
    auth_throttled = c("cuzkd_metrics_auth_throttled_total",
                       "Requests to the metrics listener answered 429 without checking their "
                       "password: their address already had its share of the checks waiting "
                       "for a bcrypt round (a flood of new passwords).")
    auth_throttled.add_metric([], access.auth_throttled_total)
    handshakes = c("cuzkd_metrics_tls_handshakes_total",
                   "TLS handshakes of the metrics listener by result: ok, or failed (not TLS, "
                   "refused, or not finished within 10 s).", labels=["result"])
    handshakes.add_metric(["ok"], access.handshakes_ok_total)
    handshakes.add_metric(["failed"], access.handshakes_failed_total)
    build = InfoMetricFamily("cuzkd_build", "cuzkd version.", value={"version": __version__})
    return [build, up, state, restarts, exits, stalls, stalled, start, first_answer, rss, cpu,
            fetch_duration, fetch_errors, field_errors, descendants_killed, stop_inflight,
            jobs_lost, drains, loop_failures, output_lines, output_bytes, labels_dropped, release,
            swaps, rollbacks, active, zombies, reload_ok, reload_time, deadlines, freezes, frozen,
            log_dropped, connections_closed, web_reload_ok, auth_refused, auth_throttled,
            handshakes,
            *_gpu_families(sample.gpus)]


def _gpu_families(gpus: Sequence[NvmlDevice]) -> list[Metric]:
    """``cuzkd_gpu_*``: the host's GPUs from NVML, ``gpu`` = NVML index (PCI bus order)."""
    g = GaugeMetricFamily
    used = g("cuzkd_gpu_memory_used_bytes", "Device memory in use, all processes (NVML).",
             labels=["gpu"])
    total = g("cuzkd_gpu_memory_total_bytes", "Device memory size (NVML).", labels=["gpu"])
    busy = g("cuzkd_gpu_utilization_ratio",
             "Share of the last sample period a kernel ran on the GPU (NVML).", labels=["gpu"])
    info = InfoMetricFamily("cuzkd_gpu", "Name and UUID of each GPU by NVML index; joins "
                            "cuzk_gpu_info on uuid.", labels=["gpu"])
    for device in first_by(gpus, lambda d: d.index):
        gpu = [str(device.index)]
        used.add_metric(gpu, device.memory_used_bytes)
        total.add_metric(gpu, device.memory_total_bytes)
        if device.utilization_ratio is not None:
            busy.add_metric(gpu, device.utilization_ratio)
        info.add_metric(gpu, {"name": device.name, "uuid": device.uuid})
    return [used, total, busy, info]


def _by_result(family: CounterMetricFamily, always: Sequence[str],
               counts: Mapping[str, int]) -> CounterMetricFamily:
    """One sample per result (or reason): ``always`` ones even at 0 (alerts on
    ``increase()``), then any other one counted."""
    for result in (*always, *sorted(set(counts) - set(always))):
        family.add_metric([result], counts.get(result, 0))
    return family
