"""Our documents against cuzk's field list, checked independently of our own decoder.

SCHEMA below is written from tests/fixtures/cuzk-status.md (field names and JSON types). The
checker walks raw JSON (``json.loads``), so a wrong name or type in our structs cannot hide
behind a round trip through them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.cuzk_schema import SCHEMA, check, document_errors

from cuzkd.errors import StatusDecodeError
from cuzkd.status.document import decode_status, encode_status
from cuzkd.status.tracker import StatusTracker


def check_document(raw: bytes) -> None:
    assert document_errors(raw) == []


def schema_field_names(spec: Any) -> set[str]:
    if isinstance(spec, dict):
        return set(spec) | {n for sub in spec.values() for n in schema_field_names(sub)}
    if isinstance(spec, list):
        return schema_field_names(spec[0])
    return set()


def test_schema_table_matches_reference_field_list(reference_dir: Path) -> None:
    documented = set(re.findall(r"`([a-z_]+)`", (reference_dir / "cuzk-status.md").read_text()))
    assert schema_field_names(SCHEMA) - documented == set()


def test_checker_accepts_reference_example_and_rejects_wrong_types(reference_dir: Path) -> None:
    raw = (reference_dir / "cuzk-status.example.json").read_bytes()
    check_document(raw)
    doc = json.loads(raw)
    doc["gpu_workers"][0]["busy_secs"] = "1.2"
    del doc["memory"]["used_bytes"]
    assert check(doc, SCHEMA) == [
        "$.memory.used_bytes: missing",
        "$.gpu_workers[0].busy_secs: expected float, got '1.2'",
    ]


class Budget:
    def total_bytes(self) -> int:
        return 1000

    def used_bytes(self) -> int:
        return 1500  # over budget: available must floor at 0

    def max_concurrent_synthesis(self) -> int:
        return 3


def test_snapshot_json_matches_cuzk_fields_through_a_job_lifecycle() -> None:
    now = [0.0]
    tracker = StatusTracker(budget=Budget(), clock=lambda: now[0], retain_finished_secs=5)
    snapshots = [encode_status(tracker.snapshot())]  # empty engine
    tracker.register_workers([(0, 0), (1, 0)])
    tracker.register_job("ps-porep-1", "porep-c2", 3)
    snapshots.append(encode_status(tracker.snapshot()))
    for p in range(3):
        tracker.partition_synth_start("ps-porep-1", p)
    now[0] += 0.25
    snapshots.append(encode_status(tracker.snapshot()))  # synthesizing, durations running
    for p in range(3):
        tracker.partition_synth_end("ps-porep-1", p)
    tracker.partition_gpu_start("ps-porep-1", 0, 0)
    tracker.partition_gpu_start("ps-porep-1", 1, 1)
    tracker.partition_failed("ps-porep-1", 2)
    now[0] += 0.5
    snapshots.append(encode_status(tracker.snapshot()))  # proving, one failed
    tracker.partition_gpu_end("ps-porep-1", 0, 0)
    tracker.partition_gpu_end("ps-porep-1", 1, 1)
    tracker.job_completed("ps-porep-1", "porep-c2", success=False)
    tracker.job_completed("ps-winning-2", "winning-post", success=True)
    tracker.set_queue_depth(2)
    tracker.set_buffers(synth_in_flight=1, pending_handles=4)
    snapshots.append(encode_status(tracker.snapshot()))  # completed, still retained
    now[0] += 10
    snapshots.append(encode_status(tracker.snapshot()))  # garbage-collected
    for raw in snapshots:
        check_document(raw)
    proving = json.loads(snapshots[3])
    assert proving["memory"] == {"total_bytes": 1000, "used_bytes": 1500, "available_bytes": 0}
    assert proving["synthesis"] == {"max_concurrent": 3, "active": 0}
    assert [p["state"] for p in proving["pipelines"][0]["partitions"]] == ["gpu", "gpu", "failed"]
    assert json.loads(snapshots[-1])["pipelines"] == []
    assert "cuzkd_extensions" in proving


def test_reference_example_decodes(reference_dir: Path) -> None:
    doc = decode_status((reference_dir / "cuzk-status.example.json").read_bytes())
    assert doc.pipelines[0].job_id == "ps-porep-1201-77-4411"
    assert doc.gpu_workers[0].busy_secs == pytest.approx(1.21)
    assert doc.cuzkd_extensions is None
    check_document(encode_status(doc))


def _mutated(reference_dir: Path, path: tuple[str | int, ...], value: Any) -> bytes:
    doc = json.loads((reference_dir / "cuzk-status.example.json").read_bytes())
    target = doc
    for step in path[:-1]:
        target = target[step]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(doc).encode()


_DELETE = object()


@pytest.mark.parametrize(("path", "value", "named"), [
    (("memory", "used_bytes"), _DELETE, "used_bytes"),
    (("uptime_secs",), "812", "uptime_secs"),
    (("pipelines", 0, "partitions", 2, "state"), "running", "state"),
    (("gpu_workers", 1, "worker_id"), -1, "worker_id"),
    (("counters", "completed_by_kind", "porep-c2"), "41", "completed_by_kind"),
    (("buffers",), _DELETE, "buffers"),
    (("counters", "total_completed"), 10**400, "total_completed"),  # float() would overflow
])
def test_malformed_documents_are_rejected_naming_the_field(
    reference_dir: Path, path: tuple[str | int, ...], value: Any, named: str
) -> None:
    with pytest.raises(StatusDecodeError, match=named):
        decode_status(_mutated(reference_dir, path, value))
