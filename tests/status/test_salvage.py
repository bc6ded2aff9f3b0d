"""A document is not all or nothing: StatusDecoder leaves out the values that do not decode and
keeps every other, and refuses only what is no status document at all."""

from __future__ import annotations

import copy
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from support.big_status import big_document

from cuzkd.errors import StatusDecodeError
from cuzkd.status.document import StatusDecoder, decode_status
from cuzkd.status.salvage import MAX_DETAILED, MESSAGE_CHARS, FieldError

WRAPPED = 2**64 - 1  # a u64 counter decremented below zero
GONE = object()  # the expected outcome: the record or entry is left out
#: a value's place in the document: keys and list indices
Where = tuple[str | int, ...]


def encoded(raw: dict[str, Any]) -> bytes:
    return json.dumps(raw, indent=2).encode()


def _example(reference_dir: Path) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((reference_dir / "cuzk-status.example.json").read_bytes())
    return raw


def _at(raw: Any, path: Where) -> Any:
    for step in path:
        raw = raw[step]
    return raw


def test_a_wrapped_counter_leaves_out_that_field_and_keeps_every_other(
        reference_dir: Path) -> None:
    """cuzk's monolithic PoSt path wraps buffers.synth_in_flight; the rest of the document is
    exactly what the strict decode gives for it without that value."""
    base = _example(reference_dir)
    wrapped = copy.deepcopy(base)
    wrapped["buffers"]["synth_in_flight"] = WRAPPED
    document, errors, _ = StatusDecoder().decode(encoded(wrapped))
    assert errors == (FieldError("$.buffers.synth_in_flight", "out_of_range",
                                 "Expected `int` <= 9223372036854775807"),)
    unknown = copy.deepcopy(base)
    unknown["buffers"]["synth_in_flight"] = None
    assert document == decode_status(encoded(unknown))
    assert document.buffers.synth_in_flight is None
    assert document.buffers.provers_in_flight == base["buffers"]["provers_in_flight"]


# (where, the odd value, its reason, the path named, the value whose outcome is checked, that
# outcome)
PLAIN_CASES: list[tuple[Where, Any, str, str, Where, Any]] = [
    (("uptime_secs",), "812", "wrong_type", "$.uptime_secs", ("uptime_secs",), None),
    (("memory", "used_bytes"), -1, "out_of_range", "$.memory.used_bytes",
     ("memory", "used_bytes"), None),
    (("memory", "used_bytes"), GONE, "missing", "$.memory", ("memory", "used_bytes"), None),
    (("synthesis", "active"), 1.5, "wrong_type", "$.synthesis.active", ("synthesis", "active"),
     None),
    (("counters", "total_completed"), 10**400, "out_of_range", "$.counters.total_completed",
     ("counters", "total_completed"), None),
    (("counters", "completed_by_kind", "porep-c2"), "41", "wrong_type",
     '$.counters.completed_by_kind["porep-c2"]', ("counters", "completed_by_kind", "porep-c2"),
     None),
    (("counters", "queue_depth"), True, "wrong_type", "$.counters.queue_depth",
     ("counters", "queue_depth"), None),
    (("pipelines", 0, "partitions", 2, "state"), "running", "unknown_value",
     "$.pipelines[0].partitions[2].state", ("pipelines", 0, "partitions", 2), GONE),
    (("pipelines", 1, "partitions"), "none", "wrong_type", "$.pipelines[1].partitions",
     ("pipelines", 1), GONE),
    (("pipelines", 0, "partitions", 1, "gpu_ms"), WRAPPED, "out_of_range",
     "$.pipelines[0].partitions[1].gpu_ms", ("pipelines", 0, "partitions", 1, "gpu_ms"), None),
    (("gpu_workers", 1, "worker_id"), -1, "out_of_range", "$.gpu_workers[1].worker_id",
     ("gpu_workers", 1), GONE),
    (("gpu_workers", 0, "busy_secs"), "long", "wrong_type", "$.gpu_workers[0].busy_secs",
     ("gpu_workers", 0, "busy_secs"), None),
    (("allocations", "srs", 0, "bytes"), WRAPPED, "out_of_range", "$.allocations.srs[0].bytes",
     ("allocations", "srs", 0), GONE),
]


def _outcome_case(base: dict[str, Any], where: Where, value: Any, checked: Where, outcome: Any,
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the document with the odd value, the document the salvage must equal)."""
    odd, expected = copy.deepcopy(base), copy.deepcopy(base)
    if value is GONE:
        del _at(odd, where[:-1])[where[-1]]
    else:
        _at(odd, where[:-1])[where[-1]] = value
    if outcome is GONE:
        del _at(expected, checked[:-1])[checked[-1]]
    else:
        _at(expected, checked[:-1])[checked[-1]] = outcome
    return odd, expected


@pytest.mark.parametrize(("where", "value", "reason", "path", "checked", "outcome"),
                         PLAIN_CASES)
def test_an_odd_value_costs_that_value_its_record_or_entry_only(
        reference_dir: Path, where: Where, value: Any, reason: str, path: str, checked: Where,
        outcome: Any) -> None:
    """A scalar of a section or an optional field becomes None; a record whose required field
    is bad is left out of its list; each is one field error naming its path."""
    odd, expected = _outcome_case(_example(reference_dir), where, value, checked, outcome)
    document, errors, _ = StatusDecoder().decode(encoded(odd))
    assert document == decode_status(encoded(expected))
    assert [(e.path, e.reason) for e in errors] == [(path, reason)]


EXTENSION_CASES: list[tuple[Where, Any, str, Where, Any]] = [
    (("jobs_in_flight",), WRAPPED, "out_of_range", ("jobs_in_flight",), None),
    (("phase_transitions", "porep-c2", "done"), "many", "wrong_type",
     ("phase_transitions", "porep-c2", "done"), None),
    (("synth_duration_seconds", "porep-c2", "bucket_counts", 3), -1, "out_of_range",
     ("synth_duration_seconds", "porep-c2"), GONE),  # its buckets are positional: all of it
    (("worker_busy", 0, "busy_seconds_total"), "idle", "wrong_type", ("worker_busy", 0), GONE),
    (("backend", ), 7, "wrong_type", ("backend",), "unknown"),  # its default
    (("draining",), "yes", "wrong_type", ("draining",), False),
]


@pytest.mark.parametrize(("where", "value", "reason", "checked", "outcome"), EXTENSION_CASES)
def test_the_extensions_follow_the_same_rules(
        where: Where, value: Any, reason: str, checked: Where, outcome: Any) -> None:
    base: dict[str, Any] = json.loads(big_document(0, extensions=True))
    ext = ("cuzkd_extensions",)
    odd, expected = _outcome_case(base, ext + where, value, ext + checked, outcome)
    document, errors, _ = StatusDecoder().decode(encoded(odd))
    assert document == decode_status(encoded(expected))
    assert [e.reason for e in errors] == [reason]
    assert errors[0].path.startswith("$.cuzkd_extensions.")


def test_extensions_that_are_no_object_are_left_out_whole() -> None:
    base: dict[str, Any] = json.loads(big_document(0, extensions=True))
    odd = {**base, "cuzkd_extensions": {**base["cuzkd_extensions"], "worker_busy": {}}}
    document, errors, _ = StatusDecoder().decode(encoded(odd))
    assert document.cuzkd_extensions is None
    assert document == decode_status(encoded({**base, "cuzkd_extensions": None}))
    assert errors == (FieldError("$.cuzkd_extensions.worker_busy", "wrong_type",
                                 "Expected `array`, got `object`"),)


def test_several_odd_values_are_each_one_error_in_document_order(reference_dir: Path) -> None:
    odd = _example(reference_dir)
    odd["uptime_secs"] = -5
    odd["buffers"]["synth_in_flight"] = WRAPPED
    odd["buffers"]["aux_in_flight"] = WRAPPED
    document, errors, _ = StatusDecoder().decode(encoded(odd))
    assert [e.path for e in errors] == ["$.uptime_secs", "$.buffers.synth_in_flight",
                                        "$.buffers.aux_in_flight"]
    assert (document.uptime_secs, document.buffers.aux_in_flight) == (None, None)


def test_one_odd_byte_costs_its_record_and_a_huge_odd_value_a_short_message(
        reference_dir: Path) -> None:
    """A string that is no UTF-8 is its field's error (the document is still one), and an
    error quotes at most MESSAGE_CHARS of the odd value, escaped by msgspec (no newline or
    terminal escape reaches a log line)."""
    odd = _example(reference_dir)
    odd["pipelines"][0]["proof_kind"] = "KIND"
    odd["gpu_workers"][0]["state"] = "x\n\x1b[31m" + "A" * 10**6
    body = encoded(odd).replace(b"KIND", b"po\xff\xferep")
    document, errors, counts = StatusDecoder().decode(body)
    assert [p.job_id for p in document.pipelines] == [p["job_id"] for p in odd["pipelines"][1:]]
    assert [w.worker_id for w in document.gpu_workers] == [1]
    assert [(e.path, e.reason) for e in errors] == [
        ("$.pipelines[0].proof_kind", "invalid_utf8"), ("$.gpu_workers[0].state", "unknown_value")]
    assert counts == {"invalid_utf8": 1, "unknown_value": 1}
    message = errors[1].message
    assert len(message) == MESSAGE_CHARS + 3 and message.endswith("A...")
    assert message.startswith("Invalid enum value 'x\\n\\x1b[31mAAA")


def _nested(depth: int) -> bytes:
    return b'{"k": ' * depth + b"0" + b"}" * depth


def test_only_what_is_no_status_document_is_refused_and_the_next_decodes(
        reference_dir: Path) -> None:
    """Not JSON, not an object, a section missing or not an object, JSON nested deeper than
    any decoder goes (msgspec raises RecursionError for a valid document carrying an unknown
    key 1000 deep): a StatusDecodeError saying why, and the decoder decodes the next."""
    base = _example(reference_dir)
    good = encoded(base)
    deep = good.rstrip()[:-1] + b', "cuzkd_future": ' + _nested(1000) + b"}"
    refused = {
        b"not json": "JSON is malformed",
        b"[1]": "Expected `object`, got `array`",
        b"null": "Expected `object`, got `null`",
        b"{}": "Object missing required field `memory`",
        encoded({**base, "memory": "full"}): "Expected `object`, got `str` - at `$.memory`",
        encoded({**base, "pipelines": {}}): "Expected `array`, got `object` - at `$.pipelines`",
        deep: "RecursionError: maximum recursion depth exceeded",
    }
    decoder = StatusDecoder()
    for body, why in refused.items():
        with pytest.raises(StatusDecodeError) as error:
            decoder.decode(body)
        assert str(error.value).startswith(why)
        assert decoder.decode(good) == (decode_status(good), (), {})


def test_a_salvaged_document_still_reuses_the_unchanged_partitions(reference_dir: Path) -> None:
    """The wrapped counter is outside the pipelines: they decode with the partition reuse even
    while every document needs the salvage; the first clean document after them decodes as
    decode_status decodes it, with the reuse too."""
    odd = _example(reference_dir)
    odd["buffers"]["synth_in_flight"] = WRAPPED
    moved = copy.deepcopy(odd)
    moved["uptime_secs"] += 1
    moved["pipelines"][0]["partitions"][0]["state"] = "failed"
    clean = copy.deepcopy(moved)
    clean["buffers"]["synth_in_flight"] = 3
    decoder = StatusDecoder()
    first = decoder.decode(encoded(odd)).document
    second = decoder.decode(encoded(moved)).document
    assert second.pipelines[1].partitions is first.pipelines[1].partitions
    assert second.pipelines[0].partitions[0].state == "failed"
    third = decoder.decode(encoded(clean))
    assert third == (decode_status(encoded(clean)), (), {})
    assert third.document.pipelines[1].partitions is first.pipelines[1].partitions
    assert decoder.decode(encoded(clean)).document.pipelines[0].partitions is (
        third.document.pipelines[0].partitions)


def test_past_max_detailed_errors_odd_partitions_are_left_out_whole_and_counted() -> None:
    """A hostile document of odd partitions costs bounded work: the first MAX_DETAILED are
    taken apart (their gpu_ms unknown) and listed; the later ones are left out whole, and
    every one is counted."""
    odd: dict[str, Any] = json.loads(big_document(0, extensions=False))
    partitions = [part for p in odd["pipelines"] for part in p["partitions"]]
    assert len(partitions) > MAX_DETAILED
    for part in partitions:
        part["gpu_ms"] = WRAPPED
    decoded = StatusDecoder().decode(encoded(odd))
    assert decoded.field_error_counts == {"out_of_range": len(partitions)}
    assert len(decoded.field_errors) == MAX_DETAILED
    kept = [part for p in decoded.document.pipelines for part in p.partitions]
    assert len(kept) == MAX_DETAILED and all(part.gpu_ms is None for part in kept)
    assert len(decoded.document.pipelines) == len(odd["pipelines"])  # no job is lost
    assert decoded.left_out() == (
        "left out: Expected `int` <= 9223372036854775807 - at `$.pipelines[0].partitions[0]"
        f".gpu_ms` (and {len(partitions) - 1} more)")


def test_unknown_keys_are_skipped_not_collected_while_salvaging(reference_dir: Path) -> None:
    """A document with one odd value and 300,000 unknown keys, at the top and inside the
    section being salvaged: the keys are skipped by msgspec as the strict decode skips them,
    not gathered into Python objects (which took 4 s and 227 MB for 16 MB of them)."""
    odd = _example(reference_dir)
    odd["buffers"]["synth_in_flight"] = WRAPPED
    unknown = b",".join(b'"k%d":0' % i for i in range(150_000))
    body = encoded(odd).replace(b'"buffers": {', b'"buffers": {' + unknown + b",")
    body = body.rstrip()[:-1] + b"," + unknown + b"}"
    tracemalloc.start()
    try:
        decoded = StatusDecoder().decode(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [e.path for e in decoded.field_errors] == ["$.buffers.synth_in_flight"]
    assert peak < 2**20  # a dict of the top-level keys alone: ~18 MB
