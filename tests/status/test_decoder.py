"""StatusDecoder reuses the partitions of jobs whose bytes did not change, and otherwise
decodes exactly what decode_status decodes; what decode_status refuses it salvages, refusing
only what is no status document."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cuzkd.errors import StatusDecodeError
from cuzkd.status.document import StatusDecoder, decode_status


def encoded(raw: dict[str, Any]) -> bytes:
    return json.dumps(raw, indent=2).encode()


def test_each_document_decodes_as_decode_status_whatever_changed(reference_dir: Path) -> None:
    base: dict[str, Any] = json.loads((reference_dir / "cuzk-status.example.json").read_bytes())
    job = base["pipelines"][0]
    docs = [copy.deepcopy(base) for _ in range(7)]
    docs[1]["uptime_secs"] += 1  # only the uptime moved
    docs[2]["pipelines"][0]["partitions"][0]["state"] = "failed"  # a partition moved
    docs[3]["pipelines"][0]["partitions"][0]["state"] = "failed"
    docs[3]["pipelines"][0]["started_secs_ago"] += 5  # same partitions, other fields moved
    docs[3]["pipelines"][0]["proof_kind"] = "snap-update"
    docs[4]["pipelines"].append({**copy.deepcopy(job), "job_id": "new"})  # a job appeared
    docs[5]["pipelines"] = [{**copy.deepcopy(job), "job_id": "new"}, job]  # reordered, one gone
    docs[6]["pipelines"] = [job, {**copy.deepcopy(job), "partitions": []}]  # listed twice
    decoder = StatusDecoder()
    for raw in [*docs, base, base]:
        assert decoder.decode(encoded(raw)) == (decode_status(encoded(raw)), (), {})


def test_an_unchanged_job_keeps_its_decoded_partitions(reference_dir: Path) -> None:
    base: dict[str, Any] = json.loads((reference_dir / "cuzk-status.example.json").read_bytes())
    moved = copy.deepcopy(base)
    moved["uptime_secs"] += 1
    moved["pipelines"][0]["partitions"][0]["state"] = "failed"
    decoder = StatusDecoder()
    first, second = decoder.decode(encoded(base)).document, decoder.decode(encoded(moved)).document
    assert second.pipelines[0].partitions is not first.pipelines[0].partitions
    assert second.pipelines[0].partitions[0].state == "failed"
    assert second.pipelines[1].partitions is first.pipelines[1].partitions


def test_a_document_that_is_none_raises_decode_status_error_then_the_next_decodes(
        reference_dir: Path) -> None:
    base: dict[str, Any] = json.loads((reference_dir / "cuzk-status.example.json").read_bytes())
    bad = copy.deepcopy(base)
    del bad["counters"]
    decoder = StatusDecoder()
    decoder.decode(encoded(base))
    with pytest.raises(StatusDecodeError) as ours:
        decoder.decode(encoded(bad))
    with pytest.raises(StatusDecodeError) as theirs:
        decode_status(encoded(bad))
    assert str(ours.value) == str(theirs.value) == "Object missing required field `counters`"
    assert decoder.decode(encoded(base)) == (decode_status(encoded(base)), (), {})


def test_every_kind_in_a_document_is_named_as_cuzk_names_it(reference_dir: Path) -> None:
    """An older reference engine says ``porep``, gRPC ``snap_update``: the series stay one per
    kind. A map with both spellings of a kind keeps cuzk's entry; an unknown kind stays."""
    raw: dict[str, Any] = json.loads((reference_dir / "cuzk-status.example.json").read_bytes())
    raw["pipelines"][0]["proof_kind"] = "porep"
    raw["pipelines"][1]["proof_kind"] = "snap_update"
    raw["counters"]["completed_by_kind"] = {"porep": 3, "winning": 2, "proofshare": 1}
    raw["counters"]["failed_by_kind"] = {"porep": 9, "porep-c2": 1}
    histogram = {"bounds": [1.0], "bucket_counts": [1], "count": 1, "sum": 0.5}
    raw["cuzkd_extensions"] = {
        "phase_transitions": {"snap": {"done": 16}}, "worker_busy": [],
        "synth_duration_seconds": {"snap": histogram}, "gpu_duration_seconds": {},
        "job_duration_seconds": {"wpost": histogram}, "jobs_in_flight": 0}
    salvaged = copy.deepcopy(raw)
    salvaged["uptime_secs"] = "soon"  # left out by the salvage, which renames all the same
    decoded = [decode_status(encoded(raw)), StatusDecoder().decode(encoded(raw)).document,
               StatusDecoder().decode(encoded(salvaged)).document]
    for document in decoded:
        assert [p.proof_kind for p in document.pipelines[:2]] == ["porep-c2", "snap-update"]
        assert document.counters.completed_by_kind == {
            "porep-c2": 3, "winning-post": 2, "proofshare": 1}
        assert document.counters.failed_by_kind == {"porep-c2": 1}
        extensions = document.cuzkd_extensions
        assert extensions is not None
        assert list(extensions.phase_transitions) == list(extensions.synth_duration_seconds) \
            == ["snap-update"]
        assert list(extensions.job_duration_seconds) == ["window-post"]
