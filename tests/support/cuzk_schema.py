"""cuzk's ``/status`` field list as a table, and a checker for raw JSON against it.

SCHEMA is written from tests/fixtures/cuzk-status.md (field names and JSON types). The
checker walks raw JSON (``json.loads``), so a wrong name or type in our structs cannot hide
behind a round trip through our own decoder. Used by the status, engine and live tests.
"""

from __future__ import annotations

import json
from typing import Any

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


def document_errors(raw: bytes) -> list[str]:
    """Every mismatch between a raw status document and cuzk's field list (empty = valid)."""
    return check(json.loads(raw), SCHEMA, extra_keys=frozenset({"cuzkd_extensions"}))
