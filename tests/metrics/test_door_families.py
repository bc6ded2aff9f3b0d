"""The front doors' families: each relayed Prove counted by kind, priority and result and
measured by its reply's own timings; holds, retries and refusals; labels bounded whatever the
bytes say."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.metrics.door_metrics import DoorMetrics
from cuzkd.metrics.exposition import encode_text
from cuzkd.states import DoorAbandon, DoorRefusal, DoorRetry, HoldEnd

Labels = tuple[tuple[str, str], ...]
DURATION = "cuzkd_door_proof_duration_seconds"


def _at(**labels: str) -> Labels:
    return tuple(sorted(labels.items()))


def _series(metrics: DoorMetrics) -> dict[tuple[str, Labels], float]:
    text = encode_text(metrics.collect()).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _of(series: dict[tuple[str, Labels], float], name: str) -> dict[Labels, float]:
    return {labels: value for (n, labels), value in series.items() if n == name}


def _bucket(series: dict[tuple[str, Labels], float], name: str, le: str,
            **labels: str) -> float:
    return series[(f"{name}_bucket", _at(le=le, **labels))]


def _request(kind: int, priority: int, payload: bytes = b"c1") -> bytes:
    return pb.ProveRequest(submit=pb.SubmitProofRequest(
        request_id="r", proof_kind=kind, priority=priority,
        vanilla_proof=payload)).SerializeToString()


def _reply(status: int, total_ms: int, **timings: int) -> bytes:
    return pb.ProveResponse(result=pb.AwaitProofResponse(
        job_id="r", status=status, proof=b"proof", total_ms=total_ms,
        **timings)).SerializeToString()


def _proofs(door: str, kind: str, priority: str, result: str) -> Labels:
    return _at(door=door, proof_kind=kind, priority=priority, result=result)


def test_no_door_no_families() -> None:
    assert list(DoorMetrics().collect()) == []


def test_each_prove_is_counted_by_kind_priority_and_result_and_measured_in_seconds() -> None:
    metrics = DoorMetrics()
    metrics.opened("gpu0", ["gpu0", "gpu1"])
    metrics.proved("gpu0", _request(pb.POREP_SEAL_COMMIT, pb.NORMAL, bytes(1 << 20)),
                   _reply(pb.AwaitProofResponse.COMPLETED, 38_000, queue_wait_ms=1_500,
                          srs_load_ms=0, synthesis_ms=33_000, gpu_compute_ms=3_500), "OK")
    metrics.proved("gpu0", _request(pb.WINNING_POST, pb.CRITICAL),
                   _reply(pb.AwaitProofResponse.FAILED, 800, synthesis_ms=12), "OK")
    metrics.proved("gpu0", _request(pb.WINNING_POST, pb.CRITICAL),
                   _reply(pb.AwaitProofResponse.COMPLETED, 30), "OK")
    series = _series(metrics)

    assert _of(series, "cuzkd_door_proofs_total") == {
        _proofs("gpu0", "porep-c2", "normal", "completed"): 1,
        _proofs("gpu0", "winning-post", "critical", "failed"): 1,
        _proofs("gpu0", "winning-post", "critical", "completed"): 1,
    }
    at = _at(door="gpu0", proof_kind="porep-c2")
    assert series[("cuzkd_door_proof_duration_seconds_sum", at)] == 38.0
    assert _bucket(series, DURATION, "30.0", door="gpu0", proof_kind="porep-c2") == 0
    assert _bucket(series, DURATION, "45.0", door="gpu0", proof_kind="porep-c2") == 1
    assert series[("cuzkd_door_proof_queue_wait_seconds_sum", at)] == 1.5
    assert series[("cuzkd_door_proof_synthesis_seconds_sum", at)] == 33.0
    assert series[("cuzkd_door_proof_gpu_compute_seconds_sum", at)] == 3.5
    assert series[("cuzkd_door_proof_srs_load_seconds_count", at)] == 1
    winning = _at(door="gpu0", proof_kind="winning-post")
    # the failure is measured too: two winning-post proofs, one in the 1 s bucket
    assert series[("cuzkd_door_proof_duration_seconds_count", winning)] == 2
    assert _bucket(series, DURATION, "0.05", door="gpu0", proof_kind="winning-post") == 1
    assert _bucket(series, DURATION, "1.0", door="gpu0", proof_kind="winning-post") == 2
    assert series[("cuzkd_door_proof_synthesis_seconds_sum", winning)] == 0.012
    assert _of(series, "cuzkd_door_engine_info") == {
        (("door", "gpu0"), ("engine", "gpu0")): 1, (("door", "gpu0"), ("engine", "gpu1")): 1}


def test_errors_odd_numbers_and_garbage_count_with_bounded_labels_and_no_timings() -> None:
    metrics = DoorMetrics()
    metrics.proved("d", _request(pb.SNAP_DEALS_UPDATE, pb.HIGH), None, "UNAVAILABLE")
    metrics.proved("d", _request(pb.SNAP_DEALS_UPDATE, pb.HIGH), None, "NOT_A_CODE")
    metrics.proved("d", _request(99, 77), _reply(42, 5_000), "OK")  # numbers newer than ours
    metrics.proved("d", b"\xff\xff\xff", b"\x0a\xff", "OK")  # neither side can be read
    metrics.proved("d", _request(pb.WINDOW_POST_PARTITION, pb.LOW), b"", "OK")  # no result
    series = _series(metrics)

    assert _of(series, "cuzkd_door_proofs_total") == {
        _proofs("d", "snap-update", "high", "error:unavailable"): 1,
        _proofs("d", "snap-update", "high", "error:unknown"): 1,
        _proofs("d", "other", "unspecified", "unknown"): 2,
        _proofs("d", "window-post", "low", "unknown"): 1,
    }
    assert not _of(series, "cuzkd_door_proof_duration_seconds_count")


def test_holds_by_kind_retries_and_refusals() -> None:
    metrics = DoorMetrics()
    metrics.opened("d", ["d"])
    metrics.held("d", 3)
    metrics.hold_ended("d", 42.0, HoldEnd.PLACED, "porep-c2")
    metrics.hold_ended("d", 0.2, HoldEnd.PLACED, "porep-c2")
    metrics.hold_ended("d", 600.0, HoldEnd.REFUSED, "porep-c2")
    metrics.hold_ended("d", float("nan"), HoldEnd.CANCELLED)  # a clock's mistake: 0
    metrics.hold_ended("d", -5.0, HoldEnd.CANCELLED)
    metrics.hold_ended("d", 1.5, HoldEnd.PLACED, "winning-post")
    metrics.held("d", 1)
    metrics.retried("d", DoorRetry.CRASH)
    metrics.refused("d", DoorRefusal.HOLD_TIMEOUT, "porep-c2")
    metrics.refused("d", DoorRefusal.HOLD_TIMEOUT, "porep-c2")
    metrics.refused("d", DoorRefusal.DEADLINE, "winning-post")
    metrics.refused("d", DoorRefusal.UNKNOWN_JOB)
    series = _series(metrics)

    assert _of(series, "cuzkd_door_held_calls") == {(("door", "d"),): 1}
    placed = _at(door="d", outcome="placed", proof_kind="porep-c2")
    assert series[("cuzkd_door_hold_duration_seconds_count", placed)] == 2
    assert series[("cuzkd_door_hold_duration_seconds_sum", placed)] == 42.2
    assert _bucket(series, "cuzkd_door_hold_duration_seconds", "30.0", door="d",
                   outcome="placed", proof_kind="porep-c2") == 1
    assert series[("cuzkd_door_hold_duration_seconds_count",
                   _at(door="d", outcome="refused", proof_kind="porep-c2"))] == 1
    assert series[("cuzkd_door_hold_duration_seconds_sum",
                   _at(door="d", outcome="placed", proof_kind="winning-post"))] == 1.5
    cancelled = _at(door="d", outcome="cancelled", proof_kind="none")
    assert series[("cuzkd_door_hold_duration_seconds_sum", cancelled)] == 0
    assert _bucket(series, "cuzkd_door_hold_duration_seconds", "0.001", door="d",
                   outcome="cancelled", proof_kind="none") == 2
    # every reason of the vocabulary is there from the first scrape, at 0 until it happens
    assert _of(series, "cuzkd_door_retries_total") == {
        (("door", "d"), ("reason", str(r))): (1 if r is DoorRetry.CRASH else 0)
        for r in DoorRetry}
    refusals = _of(series, "cuzkd_door_refusals_total")
    assert refusals == {
        **{_at(door="d", proof_kind="none", reason=str(r)): (
            1 if r is DoorRefusal.UNKNOWN_JOB else 0) for r in DoorRefusal},
        _at(door="d", proof_kind="porep-c2", reason="hold_timeout"): 2,
        _at(door="d", proof_kind="winning-post", reason="deadline"): 1}


def test_late_answers_post_waits_abandoned_work_and_quarantined_ids() -> None:
    metrics = DoorMetrics()
    metrics.opened("d", ["d"])
    metrics.answered_late("d", "winning-post")
    metrics.post_serialized("d", "winning-post", 0.7)
    metrics.post_serialized("d", "window-post", 12.0)
    metrics.abandoned("d", DoorAbandon.POST_QUEUE_EMPTY)
    metrics.quarantined("d", 2)
    series = _series(metrics)
    assert _of(series, "cuzkd_door_late_answers_total") == {
        _at(door="d", proof_kind="winning-post"): 1}
    assert series[("cuzkd_door_post_wait_seconds_count",
                   _at(door="d", proof_kind="winning-post"))] == 1
    assert _bucket(series, "cuzkd_door_post_wait_seconds", "1.0", door="d",
                   proof_kind="winning-post") == 1
    assert series[("cuzkd_door_post_wait_seconds_sum",
                   _at(door="d", proof_kind="window-post"))] == 12.0
    assert _of(series, "cuzkd_door_drain_abandoned_total") == {
        _at(door="d", reason=str(r)): (1 if r is DoorAbandon.POST_QUEUE_EMPTY else 0)
        for r in DoorAbandon}
    assert _of(series, "cuzkd_door_quarantined_requests") == {_at(door="d"): 2}


def test_promtool_check_metrics_is_silent_on_the_door_families() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: apt-get install prometheus (scripts/test.sh does)")
    metrics = DoorMetrics()
    metrics.opened("gpu0", ["gpu0"])
    metrics.proved("gpu0", _request(pb.POREP_SEAL_COMMIT, pb.NORMAL),
                   _reply(pb.AwaitProofResponse.COMPLETED, 38_000), "OK")
    metrics.proved("gpu0", _request(pb.WINNING_POST, pb.CRITICAL), None, "DEADLINE_EXCEEDED")
    metrics.hold_ended("gpu0", 3.0, HoldEnd.PLACED, "winning-post")
    metrics.refused("gpu0", DoorRefusal.QUARANTINED, "porep-c2")
    metrics.answered_late("gpu0", "winning-post")
    metrics.post_serialized("gpu0", "window-post", 3.0)
    metrics.abandoned("gpu0", DoorAbandon.NOT_LISTED)
    metrics.quarantined("gpu0", 1)
    result = subprocess.run([promtool, "check", "metrics"], input=encode_text(metrics.collect()),
                            capture_output=True, timeout=30, check=False)
    output = (result.stdout + result.stderr).decode()
    assert result.returncode == 0 and output == "", output
