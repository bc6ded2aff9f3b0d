"""Our documents against cuzk's field list, checked independently of our own decoder.

SCHEMA below is written from shared/reference/cuzk-status.md (field names and JSON types). The
checker walks raw JSON (``json.loads``), so a wrong name or type in our structs cannot hide
behind a round trip through them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from cuzkd.status.document import StatusDecodeError, decode_status, encode_status
from cuzkd.status.tracker import StatusTracker

FLOAT = "float"  # any JSON number
UINT = "uint"  # a non-negative JSON integer
STR = "string"
BOOL = "bool"
STATE = ("enum", ("pending", "synthesizing", "synth_done", "gpu", "done", "failed"))
WORKER_STATE = ("enum", ("idle", "proving"))
KIND_MAP = ("map", UINT)


def nullable(spec: Any) -> tuple[str, Any]:
    return ("nullable", spec)


ALLOCATION = {"circuit_id": STR, "bytes": UINT, "last_used_secs_ago": FLOAT, "evictable": BOOL}
SCHEMA: dict[str, Any] = {
    "uptime_secs": FLOAT,
    "memory": {"total_bytes": UINT, "used_bytes": UINT, "available_bytes": UINT},
    "synthesis": {"max_concurrent": UINT, "active": UINT},
    "pipelines": [{
        "job_id": STR,
        "proof_kind": STR,
        "started_secs_ago": FLOAT,
        "total_partitions": UINT,
        "partitions_done": UINT,
        "partitions": [{
            "index": UINT,
            "state": STATE,
            "synth_ms": nullable(UINT),
            "gpu_ms": nullable(UINT),
        }],
    }],
    "gpu_workers": [{
        "worker_id": UINT,
        "gpu_ordinal": UINT,
        "state": WORKER_STATE,
        "current_job": nullable(STR),
        "current_partition": nullable(UINT),
        "busy_secs": nullable(FLOAT),
    }],
    "allocations": {"srs": [ALLOCATION], "pce": [ALLOCATION]},
    "counters": {
        "total_completed": UINT,
        "total_failed": UINT,
        "completed_by_kind": KIND_MAP,
        "failed_by_kind": KIND_MAP,
        "queue_depth": UINT,
    },
    "buffers": {
        "synth_in_flight": UINT,
        "provers_in_flight": UINT,
        "aux_in_flight": UINT,
        "shells_in_flight": UINT,
        "pending_handles": UINT,
    },
}


def check(value: Any, spec: Any, path: str = "$", extra_keys: frozenset[str] = frozenset()
          ) -> list[str]:
    """Every mismatch between raw JSON ``value`` and ``spec``, as ``path: problem`` strings."""
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return [f"{path}: expected object, got {type(value).__name__}"]
        errors = [f"{path}.{k}: missing" for k in spec if k not in value]
        allowed = spec.keys() | extra_keys
        errors += [f"{path}.{k}: unexpected" for k in value if k not in allowed]
        for key, sub in spec.items():
            if key in value:
                errors += check(value[key], sub, f"{path}.{key}")
        return errors
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{path}: expected array, got {type(value).__name__}"]
        return [e for i, item in enumerate(value) for e in check(item, spec[0], f"{path}[{i}]")]
    if isinstance(spec, tuple):
        kind, arg = spec
        if kind == "nullable":
            return [] if value is None else check(value, arg, path)
        if kind == "enum":
            return [] if value in arg else [f"{path}: {value!r} not one of {arg}"]
        if not isinstance(value, dict):  # map
            return [f"{path}: expected object, got {type(value).__name__}"]
        return [e for k, v in value.items() for e in check(v, arg, f"{path}.{k}")]
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    ok = {
        FLOAT: is_number,
        UINT: is_number and isinstance(value, int) and value >= 0,
        STR: isinstance(value, str),
        BOOL: isinstance(value, bool),
    }[spec]
    return [] if ok else [f"{path}: expected {spec}, got {value!r}"]


def check_document(raw: bytes) -> None:
    errors = check(json.loads(raw), SCHEMA, extra_keys=frozenset({"cuzkd_extensions"}))
    assert errors == []


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
    tracker.register_job("ps-porep-1", "porep", 3)
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
    tracker.job_completed("ps-porep-1", "porep", success=False)
    tracker.job_completed("ps-winning-2", "winning", success=True)
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
    (("counters", "completed_by_kind", "porep"), "41", "completed_by_kind"),
    (("buffers",), _DELETE, "buffers"),
])
def test_malformed_documents_are_rejected_naming_the_field(
    reference_dir: Path, path: tuple[str | int, ...], value: Any, named: str
) -> None:
    with pytest.raises(StatusDecodeError, match=named):
        decode_status(_mutated(reference_dir, path, value))
