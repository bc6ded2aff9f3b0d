"""The GPU checks' arithmetic, on hand-made status documents (runs everywhere)."""

from __future__ import annotations

from typing import Any

import msgspec
from support.gpu_measure import ntt_bytes_moved, synth_done, waiting_busy_fraction
from support.scripted_engine import STATUS

from cuzkd.status.document import StatusDocument


def _doc(waiting: int, busy: float) -> StatusDocument:
    parts = [{"index": i, "state": "synth_done", "synth_ms": 1, "gpu_ms": None}
             for i in range(waiting)]
    raw: dict[str, Any] = {
        **STATUS,  # the smallest valid document (the supervisor tests' fake engine serves it)
        "pipelines": [{"job_id": "j", "proof_kind": "snap-update", "started_secs_ago": 0.0,
                       "total_partitions": max(waiting, 1), "partitions_done": 0,
                       "partitions": parts}],
        "cuzkd_extensions": {
            "phase_transitions": {}, "synth_duration_seconds": {}, "gpu_duration_seconds": {},
            "jobs_in_flight": 1,
            "worker_busy": [{"worker_id": 0, "gpu_ordinal": 0, "busy_seconds_total": busy / 2},
                            {"worker_id": 1, "gpu_ordinal": 0, "busy_seconds_total": busy / 2}],
        },
    }
    return msgspec.convert(raw, StatusDocument)


def test_only_intervals_with_work_waiting_count() -> None:
    samples = [
        (0.0, _doc(0, 0.0)),   # starving: (0 → 1) left out
        (1.0, _doc(2, 0.2)),
        (2.0, _doc(3, 2.2)),   # both ends waiting: 2.0 busy over 1 s × 2 workers
        (3.0, _doc(1, 2.4)),   # fewer waiting than workers: (2 → 3) left out
        (4.0, _doc(4, 3.0)),
        (5.0, _doc(2, 4.9)),   # 1.9 busy over 1 s × 2 workers
    ]
    result = waiting_busy_fraction(samples, workers=2)
    assert result.measured_secs == 2.0
    assert result.fraction is not None and abs(result.fraction - 3.9 / 4) < 1e-9
    assert synth_done(samples[2][1]) == 3


def test_no_waiting_interval_gives_no_fraction() -> None:
    samples = [(0.0, _doc(1, 0.0)), (1.0, _doc(0, 1.0))]
    assert waiting_busy_fraction(samples, workers=2).fraction is None


def test_ntt_traffic_counts_a_read_and_a_write_per_stage() -> None:
    assert ntt_bytes_moved(10) == 2 * 8 * 1024 * 10
